#!/usr/bin/env bash
# The demo, inside the VM (scripts/demo.sh boots it): starts the RDMA S3
# server on rxe0; the hipobj command diagnoses the host, then PUTs and GETs
# an object (checked byte for byte); the C examples PUT and GET objects
# through libhipobj.so; a server that declines RDMA shows the HTTP
# fallback; last, with GARAGE_BINARY, the server as a gateway in front of a
# three-node Garage cluster (scripts/vm/gateway-guest.sh). Each transfer
# prints its bytes, its time and what carried them.
#
# Usage: demo-guest.sh SERVER_BINARY EXAMPLES_DIR HIPOBJ_BINARY [GARAGE_BINARY]
set -euo pipefail
server_bin="$1"
examples="$2"
hipobj="$3"
work=$(mktemp -d)
export AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo-secret-key
pid=""
stop_server() {
    if [[ -n "$pid" ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT

# Starts the server with extra arguments; sets $endpoint from its first line.
start_server() {
    mkdir -p "$work/root"
    coproc server {
        exec "$server_bin" --root "$work/root" --listen 192.0.2.1:0 \
            --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" \
            --bucket demo "$@" 2>"$work/server.log"
    }
    pid=$server_PID
    local line
    read -r -t 60 line <&"${server[0]}" || { cat "$work/server.log" >&2; exit 1; }
    echo "   $line"
    endpoint=$(sed -E 's/.* on (http:[^ ]+) .*/\1/' <<<"$line")
}

run() {
    echo "\$ $(basename "$1") ${*:2}"
    "$@" --endpoint "$endpoint"
}

size=$((32 << 20))
echo "== the RDMA S3 server on rxe0"
start_server --device rxe0
export AWS_ENDPOINT_URL="$endpoint"

echo "== the hipobj command"
echo "\$ hipobj doctor"
# Exit status 2: host memory only (this VM has RDMA and no GPU).
"$hipobj" doctor || [[ $? -eq 2 ]]
head -c $((48 << 20)) /dev/urandom >"$work/data"
echo "\$ hipobj put data s3://demo/command/data --chunk 16MiB"
"$hipobj" put "$work/data" s3://demo/command/data --chunk 16MiB --no-progress
echo "\$ hipobj get s3://demo/command/data back"
"$hipobj" get s3://demo/command/data "$work/back" --chunk 16MiB --no-progress
cmp "$work/data" "$work/back" && echo "   byte-exact"
echo "\$ hipobj bench s3://demo/bench --sizes 1MiB,16MiB --streams-list 1,4 --count 4"
"$hipobj" bench s3://demo/bench --sizes 1MiB,16MiB --streams-list 1,4 --count 4

echo "== the C examples"
run "$examples/put-object" --nic rxe0 --size "$size" --pattern 7 demo big-object
run "$examples/get-object" --nic rxe0 --size "$size" --pattern 7 demo big-object
run "$examples/get-object" --nic rxe0 --offset 1000003 --size 4194301 --pattern 7 demo big-object
run "$examples/put-object" --nic rxe0 --parts 3 --size $((16 << 20)) --pattern 8 demo parts
run "$examples/token-get" --nic rxe0 --size $((16 << 20)) --pattern 8 demo parts
# 16 threads on 8 connections: each thread its own object (KEY.i).
export HIPOBJ_MAX_TRANSFERS=8
run "$examples/put-object" --nic rxe0 --threads 16 --size $((1 << 20)) --pattern 10 demo small
run "$examples/get-object" --nic rxe0 --threads 16 --iterations 2 --size $((1 << 20)) --pattern 10 demo small
unset HIPOBJ_MAX_TRANSFERS
stop_server

echo "== a server that declines RDMA: the command and the examples fall back to plain HTTP"
start_server --no-rdma
export AWS_ENDPOINT_URL="$endpoint"
echo "\$ hipobj put data s3://demo/command/plain"
"$hipobj" put "$work/data" s3://demo/command/plain --no-progress
run "$examples/put-object" --nic rxe0 --size $((16 << 20)) --pattern 9 demo plain
run "$examples/get-object" --nic rxe0 --size $((16 << 20)) --pattern 9 demo plain
stop_server
if [[ -n "${4:-}" ]]; then
    echo "== the server as a gateway in front of Garage (three nodes, replication factor 3)"
    HIPOBJ_GARAGE="$4" bash scripts/vm/garage-guest.sh bash scripts/vm/gateway-guest.sh "$server_bin" "$hipobj" 16
fi
echo "== demo done"
