#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run) and what the README gives.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section's wall time, printed as a table when the run ends (however
# it ends), so that a slow run says where its time went.
sections=()
section_start=$SECONDS
section_name=setup
section() {
    sections+=("$((SECONDS - section_start))|$section_name")
    section_name=$1
    section_start=$SECONDS
    echo "== $1"
}
timings() {
    local status=$?
    sections+=("$((SECONDS - section_start))|$section_name")
    echo "== wall time by section (exit status $status)"
    local row
    for row in "${sections[@]}"; do
        printf '%6d s  %s\n' "${row%%|*}" "${row#*|}"
    done
    printf '%6d s  in all\n' "$SECONDS"
}
trap timings EXIT

bash scripts/setup.sh

# One clean build per run: incremental state would only take disk (GiBs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
build_dir="${CARGO_TARGET_DIR:-target}"
[[ -d $build_dir ]] || build_dir=$(dirname "$build_dir")
echo "== disk: $(df -h --output=avail "$build_dir" 2>/dev/null | tail -1 | tr -d ' ') free where the build goes"

section "format, lints, docs"
cargo fmt --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --locked --all-targets --features vm-lane,s3-server,cuda-device,cli,garage-lane,seaweedfs-lane -- -D warnings
cargo clippy --locked --all-targets --manifest-path fuzz/Cargo.toml -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --features cli,fake-platform,s3-server

section "release library: SONAME and exports"
cargo build --locked --release
HIPOBJ_LIB_UNDER_TEST="${CARGO_TARGET_DIR:-target}/release/libhipobj.so" \
    cargo test --locked --test abi_symbols

section "C programs under AddressSanitizer and UndefinedBehaviorSanitizer"
HIPOBJ_TEST_SANITIZE=address,undefined cargo test --locked --test c_api

section "tests (with the S3 server: its own tests and the examples' HTTP paths)"
cargo test --locked --features s3-server,cli

section "Garage, built once per machine into a cache outside the tree (scripts/garage.sh)"
bash scripts/garage.sh >/dev/null

section "the gateway in front of a three-node Garage cluster"
bash scripts/garage-test.sh

section "the gateway in front of SeaweedFS"
bash scripts/seaweedfs-test.sh

section "the Python package: installed with pip into target/pyvenv, its unit tests on the fake library"
bash scripts/python-test.sh

section "the fake library for applications' tests: installed, and examples/ctest-fake's ctest against it"
bash scripts/fake-example.sh

section "the GPU tests build (tests/cuda.rs runs on a GPU machine: scripts/gpu/test.sh, docs/gpu.md)"
cargo test --locked --features cuda-device --test cuda --no-run

section "loom: every interleaving of the free list, the mailbox and the command queue"
bash scripts/loom.sh

section "fuzz targets, short runs (docs/reliability.md; the seeds and every regression)"
HIPOBJ_FUZZ_SECONDS=60 bash scripts/fuzz.sh 1000000

section "Soft-RoCE lane (real verbs, the S3 server and the examples in a VM)"
bash scripts/vm/lane.sh
