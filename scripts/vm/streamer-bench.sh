#!/usr/bin/env bash
# The model streamer's measurement on Soft-RoCE, in one command on the host
# (docs/performance.md, "The model streamer by RDMA"): prepares the wheels
# and our libstreamers3.so (scripts/vm/streamer-prepare.sh), builds the
# release gateway, boots the VM once with the lane's Garage cluster and runs
# scripts/vm/streamer-guest.sh bench there: the same sharded safetensors
# model streamed through the same gateway by the wheel's own backend (HTTP)
# and by ours (RDMA), in turn, a table at the end. Takes /tmp/hipobj-vm.lock
# itself; run as root.
#
# Usage: bash scripts/vm/streamer-bench.sh [--shards N] [--shard-mib M] [--rounds R]
# (defaults 3, 48 and 3). Figures: target/vm/out/streamer-bench.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
bash scripts/vm/setup.sh
[[ -x "$target/pyvenv/bin/python" ]] || bash scripts/python-test.sh >/dev/null
read -r site ours < <(bash scripts/vm/streamer-prepare.sh | tail -n 1)
cargo build --locked --release --features s3-server --bin hipobj-s3-server
garage=$(bash scripts/garage.sh)
mkdir -p "$target/vm/out"
out="$target/vm/out/streamer-bench.txt"
flock /tmp/hipobj-vm.lock timeout -k 30 3000 bash scripts/vm/run.sh --mtu 9000 \
    env HIPOBJ_GARAGE="$garage" bash scripts/vm/garage-guest.sh \
    bash scripts/vm/streamer-guest.sh bench "$target/release/hipobj-s3-server" "$target/pyvenv/bin/python" \
    "$site" "$ours" "$@" | tee "$out"
grep -q "^ours / stock:" "$out"
