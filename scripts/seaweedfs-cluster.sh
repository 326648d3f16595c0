#!/usr/bin/env bash
# A small SeaweedFS cluster on 127.0.0.1, the second S3 implementation the
# gateway is tested in front of (beside Garage's three nodes,
# scripts/vm/garage-guest.sh): starts it, runs COMMAND with its settings in
# the environment, and stops it all when COMMAND ends, whatever way.
#
#   seaweedfs-cluster.sh [--dir DIR] COMMAND...
#
# Five processes of one `weed` binary: a master, two volume servers (the
# master's default replication is 001, so every object is stored on both),
# a filer (its metadata in an embedded LevelDB store) and the filer's S3
# gateway, with an identities file holding one key made for this run. Every
# port is one the kernel gave free a moment before (HTTP and gRPC each, so
# no port+10000 convention applies), nothing listens beyond the loopback,
# and no telemetry is sent. DIR (default: a new directory under
# ${TMPDIR:-/tmp}, removed at the end) holds each process's data, log and
# pid file (DIR/NAME/pid, NAME one of master volume0 volume1 filer s3), and
# the file `env`, exported into COMMAND's environment:
#
#   HIPOBJ_SEAWEEDFS_ENDPOINT   the S3 gateway, http://127.0.0.1:PORT
#   HIPOBJ_SEAWEEDFS_REGION     us-east-1 (SeaweedFS takes the region a request is signed for)
#   HIPOBJ_SEAWEEDFS_BUCKET     a bucket the key may read and write, "hipobj"
#   HIPOBJ_SEAWEEDFS_DIR        DIR
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   the key
#
# Ready when a PUT of a small object answers 200 through the S3 gateway
# (the master has grown volumes on both volume servers) and the object
# reads back. The binary: $HIPOBJ_SEAWEEDFS, else scripts/seaweedfs.sh's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=4.48
names=(master volume0 volume1 filer s3)

fail() {
    echo "seaweedfs-cluster: $*" >&2
    exit 1
}

dir=""
own_dir=0
while [[ ${1:-} == --* ]]; do
    case $1 in
        --dir)
            dir=$2
            shift 2
            ;;
        *) fail "unknown option $1" ;;
    esac
done
(($#)) || fail "usage: seaweedfs-cluster.sh [--dir DIR] COMMAND..."
weed=${HIPOBJ_SEAWEEDFS:-$(bash "$root/scripts/seaweedfs.sh")}
[[ -x "$weed" ]] || fail "no weed binary at $weed: run scripts/seaweedfs.sh (or set HIPOBJ_SEAWEEDFS)"
"$weed" version 2>/dev/null | grep -qwF "$version" || fail "$weed is not SeaweedFS $version: $("$weed" version 2>&1 | head -1)"
command -v curl >/dev/null || fail "curl not found: run scripts/setup.sh"
command -v python3 >/dev/null || fail "python3 not found (it picks the free ports)"
if [[ -z "$dir" ]]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/hipobj-seaweedfs.XXXXXX")
    own_dir=1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

pid_of() { cat "$dir/$1/pid" 2>/dev/null || true; }

# Whether process $1 runs (a zombie does not).
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null || true)
    [[ -n "$state" && "$state" != Z ]]
}

teardown() {
    local status=$? i name pid
    # The S3 gateway first, the master last; a process that has not gone
    # within two seconds of SIGTERM is killed (the filer lingers).
    for ((i = ${#names[@]} - 1; i >= 0; i--)); do
        pid=$(pid_of "${names[i]}")
        [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
    done
    for name in "${names[@]}"; do
        pid=$(pid_of "$name")
        if [[ -n "$pid" ]]; then
            timeout 2 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if ((status != 0)); then
        for name in "${names[@]}"; do
            echo "== seaweedfs $name's warnings and errors, the last 20" >&2
            grep -E '^[WEF][0-9]{4} ' "$dir/$name/log" 2>/dev/null | tail -n 20 >&2 || true
        done
    fi
    if ((own_dir)); then
        rm -rf "$dir"
    fi
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

start=$EPOCHREALTIME
# Ten free ports at once (bound together, so all different), released for
# the processes to take a moment later.
read -r -a ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(10)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
')
((${#ports[@]} == 10)) || fail "could not find ten free ports"
master=127.0.0.1:${ports[0]}.${ports[1]}
filer=127.0.0.1:${ports[6]}.${ports[7]}
s3_port=${ports[8]}

umask 077
key_id=hipobj$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
key_secret=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
cat >"$dir/s3.json" <<EOF
{
  "identities": [
    {
      "name": "hipobj",
      "credentials": [{ "accessKey": "$key_id", "secretKey": "$key_secret" }],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    }
  ]
}
EOF
for name in "${names[@]}"; do mkdir -p "$dir/$name/data"; done

# run NAME ARGS...: starts `weed ARGS...` in DIR/NAME, its log and pid there.
run() {
    local name=$1
    shift
    (cd "$dir/$name" && exec "$weed" "$@" >>"$dir/$name/log" 2>&1) &
    echo $! >"$dir/$name/pid"
}
run master master -ip=127.0.0.1 -port="${ports[0]}" -port.grpc="${ports[1]}" \
    -mdir="$dir/master/data" -defaultReplication=001 -volumeSizeLimitMB=1024 -telemetry=false
for n in 0 1; do
    run "volume$n" volume -ip=127.0.0.1 -port="${ports[2 + 2 * n]}" -port.grpc="${ports[3 + 2 * n]}" \
        -dir="$dir/volume$n/data" -max=16 -master="$master" -preStopSeconds=0
done
run filer filer -ip=127.0.0.1 -port="${ports[6]}" -port.grpc="${ports[7]}" -master="$master" \
    -defaultStoreDir="$dir/filer/data" -localSocket="$dir/filer/sock"
run s3 s3 -ip.bind=127.0.0.1 -port="$s3_port" -port.grpc="${ports[9]}" -filer="$filer" \
    -config="$dir/s3.json" -port.iceberg=0 -port.lance=0 -localSocket="$dir/s3/sock"
umask 022

endpoint=http://127.0.0.1:$s3_port
s3() {
    curl -sS -o /dev/null -w '%{http_code}' --aws-sigv4 aws:amz:us-east-1:s3 \
        --user "$key_id:$key_secret" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@" 2>/dev/null || true
}
# Up to 60 s for the bucket to be made and a small object to go in and
# come back (the volume servers registered, volumes grown on both).
ready=""
for _ in $(seq 300); do
    for name in "${names[@]}"; do
        alive "$(pid_of "$name")" || fail "$name exited at start (log: $dir/$name/log)"
    done
    if [[ $(s3 -X PUT "$endpoint/hipobj") =~ ^(200|409)$ ]] &&
        [[ $(s3 -X PUT --data-binary ready "$endpoint/hipobj/.ready") == 200 ]] &&
        [[ $(s3 "$endpoint/hipobj/.ready") == 200 ]] &&
        [[ $(s3 -X DELETE "$endpoint/hipobj/.ready") == 204 ]]; then
        ready=yes
        break
    fi
    sleep 0.2
done
[[ -n "$ready" ]] || fail "its S3 gateway did not store an object within 60 s (logs: $dir/*/log)"

cat >"$dir/env" <<EOF
export HIPOBJ_SEAWEEDFS_ENDPOINT=$endpoint
export HIPOBJ_SEAWEEDFS_REGION=us-east-1
export HIPOBJ_SEAWEEDFS_BUCKET=hipobj
export HIPOBJ_SEAWEEDFS_DIR=$dir
export AWS_ACCESS_KEY_ID=$key_id
export AWS_SECRET_ACCESS_KEY=$key_secret
EOF
chmod 600 "$dir/env"
# shellcheck disable=SC1091
source "$dir/env"
echo "seaweedfs-cluster: SeaweedFS $version up in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s (master, two volume servers, filer, S3), S3 at $endpoint, bucket hipobj"
status=0
"$@" || status=$?
exit "$status"
