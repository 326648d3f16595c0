#!/usr/bin/env bash
# The fault soak on Soft-RoCE in one command on the host: builds the RDMA S3
# server, the release library and the soak's client (tests/soak/soak.c),
# boots the VM with the veth fabric (guest.sh --veth: rxe0 and rxe1 on the
# two ends of a veth pair, so that faults on the link reach the RDMA
# traffic) at path MTU 4096, and runs scripts/vm/soak-guest.sh there: 16
# threads of mixed transfers while the server is killed, stopped, cut off
# and the link loses, delays and reorders packets. Takes /tmp/hipobj-vm.lock
# itself (do not wrap it in flock); run as root.
#
# Usage: bash scripts/vm/soak.sh [--first COMMAND] [FAULT_SECONDS [CALM_SECONDS]]
# Defaults 150 and 45. Every kind of fault is injected once at least; under
# 300 s of faults (a short form: the lane's is 90 and 25, about 4 minutes
# with the boot) the network's faults last 8-12 s, not 15-25. The long
# form: bash scripts/vm/soak.sh 1800 120. --first: a
# command the guest runs on the same two devices before the soak, in the
# same boot (the VM lane's step across); its failure fails the run, and the
# soak runs all the same.
# Outputs under target/vm/out/soak: console.log, faults.log, client.out
# (the tally), client.err, server.log.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
first=""
if [[ ${1:-} == --first ]]; then
    first=${2:?--first needs a command}
    shift 2
fi
fault_seconds=${1:-150}
calm_seconds=${2:-45}
for n in "$fault_seconds" "$calm_seconds"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "vm/soak: FAULT_SECONDS and CALM_SECONDS are positive integers" >&2; exit 2; }
done
bash scripts/vm/setup.sh
bash scripts/build-examples.sh >/dev/null
# The server as the lane's tests build it: through `cargo test`, whose
# features include the dev-dependencies' (a `cargo build` of the binary
# unifies them without, and rebuilt the AWS SDK's crates after every lane:
# about 4 minutes of CI).
source scripts/features.sh
cargo test --locked --features "$test_features" --test e2e --no-run
server="$root/target/debug/hipobj-s3-server"
soak="$root/target/examples/soak"
out="$root/target/vm/out/soak"
rm -rf "$out"
mkdir -p "$out"
echo "== Soft-RoCE fault soak: $fault_seconds s of faults, $calm_seconds s calm"
status=0
# Bounded as a whole: a process stuck in the guest's kernel outlives any
# timeout inside it.
flock /tmp/hipobj-vm.lock timeout -k 30 "$((fault_seconds + calm_seconds + 900))" \
    bash scripts/vm/run.sh --mtu 9000 --veth bash -c \
    'first=0; if [[ -n $1 ]]; then bash -c "$1" || first=1; fi; shift
     bash scripts/vm/soak-guest.sh "$@" && exit "$first"' \
    soak "$first" "$server" "$soak" "$out" "$fault_seconds" "$calm_seconds" 2>&1 |
    tee "$out/console.log" || status=$?
if ((status != 0)); then
    # Why, in the last lines (what a CI log keeps of a long run).
    echo "vm/soak: why, from $out/console.log:" >&2
    grep -E 'FAILED|FAIL [a-z]|panicked|soak-guest: |did not|not given back|timed out' "$out/console.log" |
        grep -v -E '^soak-guest: (\+|server pid)' | tail -12 >&2 || true
    echo "vm/soak: failed (status $status); see $out" >&2
fi
exit "$status"
