#!/usr/bin/env bash
# The gateway in front of a second S3 implementation, SeaweedFS, on this
# host: installs it once per machine (scripts/seaweedfs.sh), starts its
# cluster (scripts/seaweedfs-cluster.sh) and runs tests/gateway_seaweedfs.rs
# inside it: the store tests every store's lane runs (tests/common/store.rs),
# RDMA on the fake fabric between the client and the gateway, HTTP between
# the gateway and SeaweedFS.
#
#   seaweedfs-test.sh [TEST-FILTER]
#
# HIPOBJ_SEAWEEDFS_BIG_MIB sets the large object's size (default 96).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
weed=$(bash scripts/seaweedfs.sh)
# The suite's features: one build serves the suite and every lane.
source scripts/features.sh
features=$test_features
cargo build --locked --features "$features" --test gateway_seaweedfs
export HIPOBJ_SEAWEEDFS="$weed"
bash scripts/seaweedfs-cluster.sh \
    cargo test --locked --features "$features" --test gateway_seaweedfs -- --test-threads=1 "$@"
