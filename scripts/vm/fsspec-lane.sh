#!/usr/bin/env bash
# hipobj:// through fsspec, pandas and pyarrow on Soft-RoCE, in one command
# on the host: the venv and the builds of scripts/fsspec-test.sh (run it
# first), then the VM booted once for scripts/vm/fsspec-guest.sh. Takes
# /tmp/hipobj-vm.lock itself; run as root. Output (the figures included):
# target/vm/out/fsspec-lane.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
bash scripts/vm/setup.sh
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
for need in "$target/fsspec-venv/bin/python" "$target/release/libhipobj.so" "$target/debug/hipobj-s3-server"; do
    [[ -e $need ]] || { echo "fsspec-lane: $need is missing: run scripts/fsspec-test.sh first" >&2; exit 1; }
done
mkdir -p "$target/vm/out"
flock /tmp/hipobj-vm.lock timeout -k 30 1500 bash scripts/vm/run.sh --mtu 9000 \
    bash scripts/vm/fsspec-guest.sh "$target/fsspec-venv" "$target/release/libhipobj.so" \
    "$target/debug/hipobj-s3-server" | tee "$target/vm/out/fsspec-lane.txt"
