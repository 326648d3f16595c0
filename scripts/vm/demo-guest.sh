#!/usr/bin/env bash
# The demo, inside the VM (scripts/demo.sh boots it): starts the RDMA S3
# server on rxe0, then the C examples PUT and GET objects through
# libhipobj.so; last, a server that declines RDMA shows the HTTP fallback.
# Each example prints its bytes, its time and what carried them.
#
# Usage: demo-guest.sh SERVER_BINARY EXAMPLES_DIR
set -euo pipefail
server_bin="$1"
examples="$2"
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

echo "== a server that declines RDMA: the examples fall back to plain HTTP"
start_server --no-rdma
run "$examples/put-object" --nic rxe0 --size $((16 << 20)) --pattern 9 demo plain
run "$examples/get-object" --nic rxe0 --size $((16 << 20)) --pattern 9 demo plain
stop_server
echo "== demo done"
