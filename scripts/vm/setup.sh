#!/usr/bin/env bash
# Prepares the Soft-RoCE lane: QEMU (from bookworm-backports, for a
# virtme-ng that boots Debian's 6.12 kernel), virtme-ng in a private venv,
# the rdma-core tools, and a Debian kernel image unpacked (not installed)
# under target/vm/kernel. Idempotent; run as root.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
vm="$root/target/vm"
mkdir -p "$vm"

# bookworm-backports from the archive the machine already uses.
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    archive=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -1)
    [[ -n "$archive" ]] || archive=$(awk '$1 == "deb" && $0 !~ /security/ { print $2; exit }' /etc/apt/sources.list)
    [[ -n "$archive" ]] || { echo "vm/setup: no Debian archive in the apt sources" >&2; exit 1; }
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$archive" > /etc/apt/sources.list.d/bookworm-backports.sources
    apt-get update -qq
fi
export DEBIAN_FRONTEND=noninteractive
if ! command -v qemu-system-x86_64 >/dev/null; then
    apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null
fi
apt-get install -y -qq --no-install-recommends rdma-core ibverbs-providers ibverbs-utils \
    perftest busybox-static zstd kmod iproute2 python3-venv haproxy strace >/dev/null

if [[ ! -x "$vm/venv/bin/vng" ]]; then
    python3 -m venv "$vm/venv"
    "$vm/venv/bin/pip" install -q virtme-ng==1.42
fi

# The newest backports kernel (6.12 carries rdma_rxe as a module).
if [[ ! -f "$vm/kernel/KVER" ]]; then
    version=$(apt-cache show linux-image-amd64/bookworm-backports | awk '/^Version:/ { print $2; exit }')
    image=$(apt-cache depends "linux-image-amd64=$version" | awk '/Depends: linux-image-/ { print $2; exit }')
    mkdir -p "$vm/debs"
    (cd "$vm/debs" && { ls "${image}"_*.deb >/dev/null 2>&1 || apt-get download "$image" >/dev/null; })
    rm -rf "$vm/kernel.new" && mkdir "$vm/kernel.new"
    dpkg-deb -x "$(ls "$vm/debs/${image}"_*.deb | head -1)" "$vm/kernel.new"
    kver=$(ls "$vm/kernel.new/lib/modules")
    depmod -b "$vm/kernel.new" "$kver"
    echo "$kver" > "$vm/kernel.new/KVER"
    rm -rf "$vm/kernel" && mv "$vm/kernel.new" "$vm/kernel"
fi
echo "vm/setup: kernel $(cat "$vm/kernel/KVER"), $("$vm/venv/bin/vng" --version 2>&1 | head -1)"
