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
# HIPOBJ_GARAGE_BIG_MIB sets the large object's size (default 3072). Without
# a filter, benches/gateway.rs then prints the gateway's figures against
# Garage's own (built like the tests: docs/performance.md says why).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
garage=$(bash scripts/garage.sh)
features=s3-server,cli,garage-lane
cargo build --locked --features "$features" --test gateway_garage --bench gateway
HIPOBJ_GARAGE="$garage" bash scripts/vm/garage-guest.sh \
    cargo test --locked --features "$features" --test gateway_garage -- --test-threads=1 "$@"
if (($# == 0)); then
    echo "== benches/gateway.rs: RDMA GETs through the gateway against Garage's own HTTP GETs"
    HIPOBJ_GARAGE="$garage" bash scripts/vm/garage-guest.sh \
        cargo test --locked --features "$features" --bench gateway
fi
