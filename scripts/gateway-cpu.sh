#!/usr/bin/env bash
# The gateway's own CPU per GiB it serves, on the host (no RDMA device:
# plain HTTP): a store, and two release hipobj-s3-server gateways in front
# of it, one without a cache and one with it
# (--cache-bytes, trusted), each GET of one object by curl read to
# /dev/null. The CPU is the gateway process's user + system time
# (/proc/PID/stat) across the GETs, over the GiB they moved; docs/
# performance.md, "The gateway's cost per byte", has the figures.
#
#   bash scripts/gateway-cpu.sh [MIB [ROUNDS]]     (default 256 and 8)
#
# The store is another hipobj-s3-server (its local backend, which reads
# its files in 1 MiB blocks), or, run inside scripts/vm/garage-guest.sh
# (on the host too: HIPOBJ_GARAGE names the binary), Garage's node 0 (1 MiB
# blocks), as a deployment would have it.
#
# Rows: GETs through the uncached gateway without and with
# `x-amz-checksum-mode: ENABLED` (the store's checksum asked for, as the
# gateway's RDMA GET and its cache's fills ask for it), and the cached
# gateway's hits. HIPOBJ_SERVER names another server binary (to compare a
# build before a change); HIPOBJ the command that puts the object (the
# debug build by default).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mib=${1:-256}
rounds=${2:-8}
target="${CARGO_TARGET_DIR:-target}"
server=${HIPOBJ_SERVER:-}
if [[ -z $server ]]; then
    cargo build --locked --release --features s3-server --bin hipobj-s3-server >&2
    server="$target/release/hipobj-s3-server"
fi
hipobj=${HIPOBJ:-$target/debug/hipobj}
[[ -x $hipobj ]] || cargo build --locked --features cli --bin hipobj >&2
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
key=cpu-key secret=cpu-secret-0123456789
# The store's keys and region: Garage's, or the same as the gateways'.
store_key=${AWS_ACCESS_KEY_ID:-$key} store_secret=${AWS_SECRET_ACCESS_KEY:-$secret}
region=${HIPOBJ_GARAGE_REGION:-us-east-1} bucket=${HIPOBJ_GARAGE_BUCKET:-bucket}
[[ -n ${HIPOBJ_GARAGE_ENDPOINT:-} ]] || store_key=$key store_secret=$secret
# Starts the server with its arguments; its endpoint in $endpoint.
start() {
    local out="$work/server${#pids[@]}.out"
    HIPOBJ_SECRET_KEY=$secret AWS_ACCESS_KEY_ID=$store_key AWS_SECRET_ACCESS_KEY=$store_secret \
        "$server" --listen 127.0.0.1:0 --no-rdma --access-key "$key" "$@" >"$out" 2>"$out.err" &
    pids+=($!)
    for _ in $(seq 100); do
        endpoint=$(grep -o 'http://[0-9.:]*' "$out" | head -1 || true)
        [[ -n $endpoint ]] && return 0
        sleep 0.1
    done
    cat "$out.err" >&2
    echo "gateway-cpu: the server did not start" >&2
    exit 1
}
s3() {
    curl -sS --fail-with-body --aws-sigv4 "aws:amz:us-east-1:s3" --user "$key:$secret" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
}
if [[ -n ${HIPOBJ_GARAGE_ENDPOINT:-} ]]; then
    store=$HIPOBJ_GARAGE_ENDPOINT
    what="Garage's node 0"
else
    mkdir -p "$work/root/$bucket"
    start --root "$work/root"
    store=$endpoint
    what="a hipobj-s3-server's local backend"
fi
start --upstream "$store" --upstream-region "$region"
plain=$endpoint plain_pid=${pids[-1]}
start --upstream "$store" --upstream-region "$region" --cache-bytes $(((mib + 1) << 21)) \
    --cache-max-object-bytes $((mib << 20)) --cache-validate ttl=3600
cached=$endpoint cached_pid=${pids[-1]}
head -c $((mib << 20)) /dev/urandom >"$work/object"
# Put with its CRC64/NVME (the command computes it), as a client would.
AWS_ACCESS_KEY_ID=$store_key AWS_SECRET_ACCESS_KEY=$store_secret AWS_REGION=$region \
    "$hipobj" put "$work/object" "s3://$bucket/object" --endpoint "$store" --chunk "${mib}MiB" \
    --streams 1 --no-progress >/dev/null
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# CPU seconds per GiB of the gateway $1 (pid $2) over ROUNDS GETs, with
# curl's extra arguments after.
measure() {
    local endpoint=$1 pid=$2 before after start
    shift 2
    s3 "$@" -o /dev/null "$endpoint/$bucket/object" # warm
    before=$(ticks "$pid")
    start=$(date +%s.%N)
    for _ in $(seq "$rounds"); do
        s3 "$@" -o /dev/null "$endpoint/$bucket/object"
    done
    after=$(ticks "$pid")
    awk -v t=$((after - before)) -v hz="$hz" -v n="$rounds" -v mib="$mib" \
        -v s="$(date +%s.%N)" -v s0="$start" 'BEGIN {
        gib = n * mib / 1024
        printf "%.3f CPU s/GiB (%.2f s for %.1f GiB), %.0f MiB/s\n", t / hz / gib, t / hz, gib, gib * 1024 / (s - s0)
    }'
}
echo "gateway-cpu: $mib MiB object, $rounds GETs each, the store $what; $("$server" --version)"
printf '  %-44s %s\n' "uncached, no checksum asked:" "$(measure "$plain" "$plain_pid")"
printf '  %-44s %s\n' "uncached, x-amz-checksum-mode: ENABLED:" \
    "$(measure "$plain" "$plain_pid" -H "x-amz-checksum-mode: ENABLED")"
printf '  %-44s %s\n' "cached hits, x-amz-checksum-mode: ENABLED:" \
    "$(measure "$cached" "$cached_pid" -H "x-amz-checksum-mode: ENABLED")"
