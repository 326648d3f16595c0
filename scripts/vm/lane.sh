#!/usr/bin/env bash
# The Soft-RoCE lane: builds the tests that need real RDMA on the host
# (tests/rxe.rs: verbs, CM and the library on rxe0; tests/e2e.rs: the S3
# server, the command and the C examples end to end) and the examples
# against the installed library, into the hardware lane's bundle
# (scripts/hw/lane.sh build: target/hw), checks that the bundle refuses
# clearly on this host when it has no RDMA device, boots the VM and runs
# the bundle's run.sh there against the kernel's rdma_rxe at path MTU 4096
# (report, tests/rxe.rs, tests/e2e.rs and the quick bench: the hardware
# lane's steps, so CI keeps them working), the Python package's lane
# tests and hipobj:// through fsspec, pandas and pyarrow
# (scripts/vm/fsspec-guest.sh, with the venv scripts/fsspec-test.sh made),
# then tests/rxe.rs again at 1024, then, on two devices, the
# hardware lane's step across and the fault soak's short form
# (scripts/vm/soak.sh). The first boot also starts the
# three-node Garage cluster (scripts/garage.sh builds Garage once per
# machine, into a cache outside the tree), checks it over S3
# (scripts/vm/garage-check.sh, short form) and puts two gateways in front
# of it (scripts/vm/gateway-guest.sh), with the gateway's benchmark, then
# streams a model through one with the Run:ai model streamer and our
# libstreamers3.so, by RDMA (scripts/vm/streamer-guest.sh check).
# Fails if any test fails or the VM cannot start.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
# Each phase's wall time, for the run's log.
phase_start=$SECONDS
took() {
    echo "== vm/lane: $1: $((SECONDS - phase_start)) s"
    phase_start=$SECONDS
}
source scripts/features.sh
# The Python package's venv (target/pyvenv), which the model streamer's
# step and the guest's Python tests use: scripts/python-test.sh makes it
# (the suite runs it before the lane). Made here first when missing, not
# found missing after the bundle's build.
if [[ ! -x "${CARGO_TARGET_DIR:-target}/pyvenv/bin/python" ]]; then
    bash scripts/python-test.sh
    took "scripts/python-test.sh (its venv, for the lane)"
fi
bash scripts/vm/setup.sh
took "the kernel and the guest image"
garage=$(bash scripts/garage.sh)
bash scripts/hw/lane.sh build --dev-bench
took "the hardware lane's bundle"
# The model streamer's wheels and our libstreamers3.so, fetched and built
# here: the VM has no network (scripts/vm/streamer-prepare.sh).
read -r streamer_site streamer_ours < <(bash scripts/vm/streamer-prepare.sh | tail -n 1)
took "the model streamer's wheels and libstreamers3.so"
# The venv with fsspec, pandas and pyarrow that the guest's hipobj:// tests
# use: scripts/fsspec-test.sh makes it (the suite runs it before the lane).
if [[ ! -x "${CARGO_TARGET_DIR:-target}/fsspec-venv/bin/python" ]]; then
    bash scripts/fsspec-test.sh
    took "scripts/fsspec-test.sh (its venv, for the guest)"
fi
mapfile -t binaries < <(
    cargo test --locked --features "$test_features" --test rxe --test e2e --no-run \
        --message-format=json |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])'
)
if ((${#binaries[@]} != 2)); then
    # Show the compiler's messages, which the JSON stream above swallowed.
    cargo test --locked --features "$test_features" --test rxe --test e2e --no-run || true
    echo "vm/lane: expected the rxe and e2e test binaries, built: ${binaries[*]}" >&2
    exit 1
fi
# A test binary that outlives 30 minutes (a process stuck in the kernel's
# rxe teardown, say) is killed and fails the lane, with the kernel's rxe
# messages shown.
# After them, the Python package's lane tests (python/tests/test_lane.py,
# with the venv scripts/python-test.sh made) on the release library the
# examples were built against and the lane's S3 server.
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
# The hardware lane on this host: a host without an RDMA device (CI's)
# must get a clear refusal (status 3) and nothing run.
refusal=0
bash "$target/hw/run.sh" --report-only --out "$target/hw-host" >"$target/hw-host.log" 2>&1 || refusal=$?
if ((refusal == 3)) && grep -q "hardware lane: refused: this host has no RDMA device" "$target/hw-host.log"; then
    echo "== hardware lane on the host: refused clearly (no RDMA device)"
elif ((refusal == 0)); then
    echo "== hardware lane on the host: it has an RDMA device ($(grep 'hardware lane: device' "$target/hw-host.log"))"
else
    cat "$target/hw-host.log"
    echo "vm/lane: the hardware lane's report on the host failed (status $refusal)" >&2
    exit 1
fi
python="bash scripts/vm/python-guest.sh $(printf %q "$target/demo-prefix/lib/libhipobj.so.0") $(printf %q "$target/debug/hipobj-s3-server")"
# hipobj:// through fsspec, pandas and pyarrow by RDMA, with the venv
# scripts/fsspec-test.sh left (scripts/vm/fsspec-guest.sh).
fsspec="bash scripts/vm/fsspec-guest.sh $(printf %q "$target/fsspec-venv") $(printf %q "$target/release/libhipobj.so") $(printf %q "$target/debug/hipobj-s3-server")"
tests='status=0; for test in "$@"; do echo "== $test"; timeout -k 10 1800 "$test" --test-threads=1 || { status=1; dmesg | grep -i rxe | tail -20; }; done'
each="$tests"'; exit $status'
# The first boot then checks the Garage cluster (docs/reliability.md, "The
# lane's Garage cluster"), with a 16 MiB object where the long form streams
# 3 GiB, and the gateway in front of it over rxe0: two gateways, the hipobj
# command by RDMA through each and through haproxy while one is killed, then
# the benchmark of RDMA GETs through a gateway against Garage's own HTTP
# GETs, 16 MiB (scripts/vm/gateway-guest.sh; docs/performance.md has the
# 64 and 256 MiB rows of longer runs: `... 16 16 64 256` by hand).
garage_check="env HIPOBJ_GARAGE=$(printf %q "$garage") bash scripts/vm/garage-check.sh 16"
# In the same cluster, after the gateway's checks: the model streamer
# (the 0.17.1 wheel's libstreamer.so) with our libstreamers3.so, a sharded
# safetensors model (3 shards of 16 MiB) streamed by RDMA through a gateway
# in front of Garage, byte-exact, every byte by RDMA
# (scripts/vm/streamer-guest.sh check).
gateway_guest="bash scripts/vm/gateway-guest.sh $(printf %q "$target/debug/hipobj-s3-server") $(printf %q "$target/debug/hipobj") 16 16"
streamer_guest="bash scripts/vm/streamer-guest.sh check $(printf %q "$target/debug/hipobj-s3-server") $(printf %q "$target/pyvenv/bin/python") $(printf %q "$streamer_site") $(printf %q "$streamer_ours") --shard-mib 16"
gateway_check="env HIPOBJ_GARAGE=$(printf %q "$garage") bash scripts/vm/garage-guest.sh bash -c $(printf %q "status=0; $gateway_guest || status=1; echo '== scripts/vm/streamer-guest.sh'; $streamer_guest || status=1; exit \$status")"
# The tests the step across runs on two devices (the third boot, below)
# are left out of the first boot's e2e step: each of tests/e2e.rs runs
# once in the lane, both at path MTU 4096.
across="put_then_get_16_mib striped ranged_gets three_part token_path without_the_proof"
skip_across=$(printf -- '--skip %s ' $across)
hw="bash $(printf %q "$target/hw/run.sh") --device rxe0 --ip 192.0.2.1 --out $(printf %q "$target/vm/out/hw") --steps contract,e2e,bench --bench quick --e2e-args $(printf %q "$skip_across")"
first='status=0; echo "== the hardware lane (scripts/hw/run.sh) on rxe0 (at $SECONDS s of the boot)"; timeout -k 10 5400 '"$hw"' || { status=1; dmesg | grep -i rxe | tail -20; }; echo "== python/tests/test_lane.py (at $SECONDS s of the boot)"; timeout -k 10 900 '"$python"' || status=1; echo "== python/tests/test_fsspec_lane.py (at $SECONDS s of the boot)"; timeout -k 10 600 '"$fsspec"' || status=1; echo "== scripts/vm/garage-check.sh (at $SECONDS s of the boot)"; timeout -k 10 900 '"$garage_check"' || status=1; echo "== scripts/vm/gateway-guest.sh (at $SECONDS s of the boot)"; timeout -k 10 1500 '"$gateway_check"' || status=1; echo "== the steps ended (at $SECONDS s of the boot)"; exit $status'
# One boot at a RoCE fabric's path MTU (4096, a 9000-byte netdev) runs them
# all; a second at 1024 (a 1500-byte netdev) runs tests/rxe.rs again, so
# that both paths stay tested (the Python package's lane tests, which the
# path MTU does not concern, run in the first only). The lane fails if any
# test fails.
echo "== Soft-RoCE lane, path MTU 4096: ${binaries[*]}"
status=0
# A boot is bounded as a whole too (timeout kills QEMU): a process stuck in
# the guest's kernel outlives any timeout inside it.
timeout -k 30 3600 bash scripts/vm/run.sh --mtu 9000 bash -c "$first" lane "${binaries[@]}" || status=1
took "the first boot (path MTU 4096)"
rxe=$(printf '%s\n' "${binaries[@]}" | grep '/rxe-')
echo "== Soft-RoCE lane, path MTU 1024: $rxe"
timeout -k 30 1200 bash scripts/vm/run.sh --mtu 1500 bash -c "$each" lane "$rxe" || status=1
took "the second boot (path MTU 1024)"
# A third boot, on two devices (guest.sh --veth: rxe0 at 192.0.2.1, rxe1
# at 192.0.2.2, a veth pair and a bridge between them, a fabric that
# packets cross): first the hardware lane's step across, a share of
# tests/e2e.rs with the S3 servers on rxe1 and the clients on rxe0, as on a
# host with two ports or two NICs (the first boot skipped these); then
# the fault soak's short form
# (scripts/vm/soak.sh, docs/reliability.md).
across_step="bash $(printf %q "$target/hw/run.sh") --device rxe0 --ip 192.0.2.1 --server-device rxe1 --server-ip 192.0.2.2 --steps across --across-args $(printf %q "$across") --out $(printf %q "$target/vm/out/hw-across")"
echo "== Soft-RoCE lane, two devices: the hardware lane's step across, then the fault soak (short form)"
# The soak's short form: 90 s of faults (every kind once at least, the
# network's for 8-12 s), 25 s calm.
bash scripts/vm/soak.sh --first "$across_step" 90 25 || status=1
took "the boot on two devices: across and the soak"
exit "$status"
