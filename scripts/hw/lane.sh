#!/usr/bin/env bash
# The hardware lane: the real-verbs tests, the end-to-end tests and the
# benchmark on a host's own RDMA device, not in a VM (docs/hardware.md).
#
#   bash scripts/hw/lane.sh build [--gpu] [--dev-bench]
#       builds the bundle into target/hw (stripped test binaries, the
#       command, the S3 server, the release library, the C examples and
#       scripts/hw/run.sh): carry all of target/hw to a host without a Rust
#       toolchain and run target/hw/run.sh there. --gpu adds tests/cuda.rs
#       (scripts/gpu/test.sh build) for a host with an NVIDIA GPU.
#       --dev-bench builds the bench in the tests' profile, from the
#       dependencies they were built with, instead of an optimized build of
#       its own: the VM lane's, which checks that the step works (its
#       figures are not the library's; the bundle's VERSION says so).
#   bash scripts/hw/lane.sh [RUN ARGUMENTS]
#       builds the bundle and runs it here (run.sh --help: the device, the
#       steps, the bench's length; exit status 3: no usable RDMA device).
#
# The VM lane (scripts/vm/lane.sh) runs the same bundle's run.sh against
# rxe0, so that CI keeps the lane working where there is no NIC.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
gpu=0
dev_bench=0
build_only=0
if [[ ${1:-} == build ]]; then
    build_only=1
    shift
    while (($#)); do
        case $1 in
            --gpu) gpu=1; shift ;;
            --dev-bench) dev_bench=1; shift ;;
            *) echo "hw/lane: build takes --gpu and --dev-bench, not $1" >&2; exit 2 ;;
        esac
    done
fi
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
hw="$target/hw"

# Prints the executable of each artifact of a cargo JSON stream whose
# target name is one of the arguments.
executables() {
    python3 -c 'import json,sys
names = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("name") in names and m.get("executable"):
        print(t["name"], m["executable"])' "$@"
}

bash scripts/build-examples.sh
# The tests' features: --dev-bench builds the bench with them too, so that
# it reuses the dependencies the tests were built with.
source scripts/features.sh
declare -A built
while read -r name path; do built[$name]=$path; done < <(
    cargo test --locked --features "$test_features" --test rxe --test e2e --no-run \
        --message-format=json | executables rxe e2e
)
if ((dev_bench)); then
    bench_build=(--profile dev --features "$test_features")
    bench_profile="bench: the tests' profile (unoptimized; its figures are not the library's)"
else
    bench_build=(--features vm-lane)
    bench_profile="bench: optimized"
fi
while read -r name path; do built[bench]=$path; done < <(
    cargo bench --locked --no-run "${bench_build[@]}" --bench rxe --message-format=json | executables rxe
)
for need in rxe e2e bench; do
    [[ -x ${built[$need]:-} ]] || { echo "hw/lane: the $need binary was not built" >&2; exit 1; }
done
rm -rf "$hw"
mkdir -p "$hw"/{bin,lib,tests,bench,examples}
install -m 755 "${built[rxe]}" "$hw/tests/rxe-tests"
install -m 755 "${built[e2e]}" "$hw/tests/e2e-tests"
install -m 755 "${built[bench]}" "$hw/bench/rxe-bench"
# The programs the end-to-end tests start: the ones cargo built them with.
install -m 755 "$target/debug/hipobj" "$target/debug/hipobj-s3-server" "$hw/bin/"
cp -L "$target/demo-prefix/lib/libhipobj.so.0" "$hw/lib/"
install -m 755 "$target"/examples/{get-object,put-object,token-get} "$hw/examples/"
if ((gpu)); then
    bash scripts/gpu/test.sh build
    install -m 755 "$target/gpu/cuda-tests" "$hw/tests/"
fi
strip "$hw"/tests/* "$hw"/bench/* "$hw"/bin/*
install -m 755 scripts/hw/run.sh "$hw/run.sh"
echo "$(git describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%FT%TZ), $bench_profile" >"$hw/VERSION"
echo "hw/lane: the bundle is $hw ($(du -sh "$hw" | cut -f1)); run it with $hw/run.sh"
((build_only)) && exit 0
exec bash "$hw/run.sh" "$@"
