#!/usr/bin/env bash
# Boots the lane's VM (software emulation: the host's KVM backend cannot run
# a stock kernel) with the project tree shared at the same path, runs
# `scripts/vm/guest.sh [--mtu BYTES] COMMAND...` inside (--mtu: the rxe
# netdev's MTU, see guest.sh), and exits with its status.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
vm="$root/target/vm"
kernel="$vm/kernel/boot/vmlinuz-$(cat "$vm/kernel/KVER")"
mkdir -p "$vm/out"
export PATH="$vm/venv/bin:$PATH"
quoted=$(printf '%q ' "$@")
# Through a pipe: QEMU reopens its standard output and error, which for a file
# would start writing again at offset 0 over what the caller logged before.
"$vm/venv/bin/vng" --run "$kernel" --disable-kvm --cpus 2 --memory "${HIPOBJ_VM_MEMORY:-12G}" \
    --rwdir "$vm/out" --cwd "$root" \
    --exec "bash scripts/vm/guest.sh $quoted" </dev/null 2>&1 | cat
