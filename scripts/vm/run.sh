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
# The command goes in a file the guest reads (the host's tree is shared):
# vng passes its --exec on the kernel's command line, which x86 cuts at
# 2048 bytes, and a cut command is never run: the guest just idles. The
# lane's first boot, with its long paths, came to 2109.
command=$(mktemp "$vm/out/command.XXXXXX")
trap 'rm -f "$command"' EXIT
printf 'exec bash scripts/vm/guest.sh%s\n' "$(printf ' %q' "$@")" >"$command"
# Through a pipe: QEMU reopens its standard output and error, which for a file
# would start writing again at offset 0 over what the caller logged before.
"$vm/venv/bin/vng" --run "$kernel" --disable-kvm --cpus 2 --memory "${HIPOBJ_VM_MEMORY:-12G}" \
    --rwdir "$vm/out" --cwd "$root" \
    --exec "bash $(printf %q "$command")" </dev/null 2>&1 | cat
