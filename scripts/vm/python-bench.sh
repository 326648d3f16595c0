#!/usr/bin/env bash
# The Python package's model benchmark on Soft-RoCE, in one command on the
# host: builds the release library, the server and the command, boots the
# VM once and runs scripts/vm/python-bench.py there (a sharded safetensors
# model loaded through the package against the command's best throughput
# for the same objects, and where the package's time goes per transfer).
# Takes /tmp/hipobj-vm.lock itself; run as root.
#
# Usage: bash scripts/vm/python-bench.sh [SHARDS [SHARD_MIB [ROUNDS]]]
# (defaults 16, 64 and 2). Figures: target/vm/out/python-bench.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
bash scripts/vm/setup.sh
bash scripts/python-test.sh >/dev/null
bash scripts/build-examples.sh >/dev/null
cargo build --locked --release --features s3-server,cli --bin hipobj-s3-server --bin hipobj
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
mkdir -p "$target/vm/out"
out="$target/vm/out/python-bench.txt"
flock /tmp/hipobj-vm.lock timeout -k 30 3000 bash scripts/vm/run.sh --mtu 9000 \
    env HIPOBJ_LIBRARY="$target/demo-prefix/lib/libhipobj.so.0" PYTHONDONTWRITEBYTECODE=1 \
    "$target/pyvenv/bin/python" scripts/vm/python-bench.py "$target/release/hipobj-s3-server" \
    "$target/release/hipobj" "${1:-16}" "${2:-64}" "${3:-2}" | tee "$out"
