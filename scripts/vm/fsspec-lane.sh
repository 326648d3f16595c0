#!/usr/bin/env bash
# hipobj:// through fsspec, pandas and pyarrow on Soft-RoCE, in one command
# on the host: the venv and the builds of scripts/fsspec-test.sh (run it
# first), then the VM booted once for scripts/vm/fsspec-guest.sh. Takes
# /tmp/hipobj-vm.lock itself; run as root. With --bench, the timed reads
# of scripts/vm/fsspec-bench.py after the tests. Output (the figures
# included): target/vm/out/fsspec-lane.txt.
#
# Usage: scripts/vm/fsspec-lane.sh [--bench]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
case "${1:-}" in
"" | --bench) ;;
*) echo "usage: scripts/vm/fsspec-lane.sh [--bench]" >&2; exit 2 ;;
esac
bash scripts/vm/setup.sh
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
for need in "$target/fsspec-venv/bin/python" "$target/release/libhipobj.so" "$target/debug/hipobj-s3-server"; do
    [[ -e $need ]] || { echo "fsspec-lane: $need is missing: run scripts/fsspec-test.sh first" >&2; exit 1; }
done
mkdir -p "$target/vm/out"
flock /tmp/hipobj-vm.lock timeout -k 30 1500 bash scripts/vm/run.sh --mtu 9000 \
    bash scripts/vm/fsspec-guest.sh "$target/fsspec-venv" "$target/release/libhipobj.so" \
    "$target/debug/hipobj-s3-server" ${1:+"$1"} | tee "$target/vm/out/fsspec-lane.txt"
