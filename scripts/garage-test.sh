#!/usr/bin/env bash
# The gateway in front of a real distributed S3 store, on this host:
# builds Garage once per machine (scripts/garage.sh), starts its three-node
# cluster (scripts/vm/garage-guest.sh, which runs on any Linux machine) and
# runs tests/gateway_garage.rs inside it: RDMA on the fake fabric between
# the client and the gateway, HTTP between the gateway and Garage. The
# Soft-RoCE lane runs the same gateway over real verbs (scripts/vm/lane.sh).
#
#   garage-test.sh [TEST-FILTER]
#
# HIPOBJ_GARAGE_BIG_MIB sets the large object's size (default 2049, past 2^31
# bytes). Without
# a filter, benches/gateway.rs then prints the gateway's figures against
# Garage's own (built like the tests: docs/performance.md says why).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
garage=$(bash scripts/garage.sh)
# SeaweedFS's lane builds with the same features: one build serves both.
source scripts/features.sh
features=$test_features
cargo build --locked --features "$features" --test gateway_garage --bench gateway

# As root, everything runs in a network namespace of its own whose loopback
# acknowledges at once (the route's quickack): on a loopback with delayed
# ACKs, about half of Garage's GETs stall 40 ms at a block boundary, whoever
# asks (docs/performance.md, "The gateway in front of Garage").
run=()
if [[ $(id -u) -eq 0 ]] && command -v ip >/dev/null; then
    ns="hipobj-garage-$$"
    ip netns add "$ns"
    trap 'ip netns del "$ns"' EXIT
    ip -n "$ns" link set lo up
    ip -n "$ns" route change local 127.0.0.0/8 dev lo proto kernel scope host src 127.0.0.1 table local quickack 1
    ip -n "$ns" route change local 127.0.0.1 dev lo proto kernel scope host src 127.0.0.1 table local quickack 1
    run=(ip netns exec "$ns")
else
    echo "garage-test: not root: the loopback keeps its delayed ACKs (Garage's GETs stall at random; the benchmark shows it)" >&2
fi
export HIPOBJ_GARAGE="$garage"
"${run[@]}" bash scripts/vm/garage-guest.sh \
    cargo test --locked --features "$features" --test gateway_garage -- --test-threads=1 "$@"
if (($# == 0)); then
    echo "== benches/gateway.rs: RDMA GETs through the gateway against Garage's own HTTP GETs"
    "${run[@]}" bash scripts/vm/garage-guest.sh \
        cargo test --locked --features "$features" --bench gateway
fi
