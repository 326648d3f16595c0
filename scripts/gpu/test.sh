#!/usr/bin/env bash
# The tests that need an NVIDIA GPU (tests/cuda.rs: the GPU contract on the
# CUDA driver, and whole transfers of device memory through the library on
# the fake fabric with the real driver).
#
#   bash scripts/gpu/test.sh          build and run them here (a GPU machine
#                                     with a Rust toolchain)
#   bash scripts/gpu/test.sh build    build them into target/gpu/cuda-tests
#                                     (stripped), to carry to a GPU machine
#                                     without a toolchain
#   target/gpu/cuda-tests --test-threads=1 --nocapture
#                                     run them there (needs libcuda.so.1
#                                     and a GPU; without, every test fails)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
mode=${1:-run}
case "$mode" in
build | run) ;;
*)
    echo "scripts/gpu/test.sh: build or run, not $mode" >&2
    exit 2
    ;;
esac
binary=$(cargo test --locked --release --features cuda-device --test cuda --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("name") == "cuda" and m.get("executable"):
        print(m["executable"])')
[[ -x "$binary" ]] || { echo "scripts/gpu/test.sh: tests/cuda.rs was not built" >&2; exit 1; }
mkdir -p target/gpu
cp "$binary" target/gpu/cuda-tests
strip target/gpu/cuda-tests
if [[ $mode == build ]]; then
    echo "target/gpu/cuda-tests ($(stat -c %s target/gpu/cuda-tests) bytes)"
    exit 0
fi
target/gpu/cuda-tests --test-threads=1 --nocapture
