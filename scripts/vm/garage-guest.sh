#!/usr/bin/env bash
# Inside the VM (or on any Linux machine): a three-node Garage cluster on
# 127.0.0.1 with replication factor 3, for the lane's tests of the gateway
# in front of a real distributed S3 store (docs/reliability.md, "The lane's
# Garage cluster"). Starts the cluster, runs COMMAND with its settings in
# the environment, and tears it all down when COMMAND ends, whatever way.
#
#   garage-guest.sh [--dir DIR] [--data DIR] COMMAND...
#   garage-guest.sh kill-node N     (from inside COMMAND) SIGKILL node N (0-2)
#   garage-guest.sh start-node N    (from inside COMMAND) start node N again
#   garage-guest.sh rss             (from inside COMMAND) each node's resident memory
#
# DIR (default: a new directory under ${TMPDIR:-/tmp}, removed at the end)
# holds each node's metadata, data, configuration and log, and the file
# `env`, which COMMAND finds in HIPOBJ_GARAGE_ENV and may source (it is
# exported into COMMAND's environment already):
#
#   HIPOBJ_GARAGE_ENDPOINT   node 0's S3 API, http://127.0.0.1:3900
#   HIPOBJ_GARAGE_ENDPOINTS  the three nodes' S3 APIs (ports 3900, 3910, 3920)
#   HIPOBJ_GARAGE_REGION     Garage's s3_region, "garage"
#   HIPOBJ_GARAGE_BUCKET     a bucket the key may read and write, "hipobj"
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   that key (made by `garage key create`)
#   HIPOBJ_GARAGE_DIR        DIR, for the helpers above
#
# Garage's S3 API serves path-style addresses (http://HOST:PORT/BUCKET/KEY)
# without a root_domain; virtual-hosted ones would need DNS, so clients
# must use path style.
#
# The binary: $HIPOBJ_GARAGE, else the cache scripts/garage.sh builds into
# on the host (the guest's root file system is the host's).
#
# --data puts the nodes' data (the blocks: three copies of every object)
# under another directory, for objects that would not fit in the guest's
# memory (its /tmp is a tmpfs): each node's is DATA/garage-nodeN, made empty
# and removed at the end. The metadata (LMDB, which needs a file system with
# coherent shared writable mmap, unlike 9p) stays under DIR.
set -euo pipefail
version=2.5.0
garage=${HIPOBJ_GARAGE:-${HIPOBJ_CACHE:-$HOME/.cache/hipobj}/garage-$version-o${HIPOBJ_GARAGE_OPT_LEVEL:-1}/bin/garage}
nodes=3
ip=127.0.0.1
# Node N listens on 39N0 (S3), 39N1 (RPC), 39N3 (admin).
s3_port() { echo $((3900 + 10 * $1)); }
rpc_port() { echo $((3901 + 10 * $1)); }
admin_port() { echo $((3903 + 10 * $1)); }

fail() {
    echo "garage-guest: $*" >&2
    exit 1
}

cli() {
    # The CLI reaches the cluster through node 0's RPC port, with the secret
    # from node 0's configuration.
    "$garage" -c "$dir/node0/garage.toml" "$@"
}

node_pid() { cat "$dir/node$1/pid" 2>/dev/null || true; }

# Whether process $1 runs. A killed node stays a zombie until its parent
# reaps it, and a node that start-node restarted has outlived its shell: its
# parent is then the machine's PID 1, which in a container may never reap.
# `kill -0` succeeds on a zombie, so this reads the state (once: the process
# may go between two reads).
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null || true)
    [[ -n "$state" && "$state" != Z ]]
}

start_node() {
    local n=$1
    NO_COLOR=1 "$garage" -c "$dir/node$n/garage.toml" server >>"$dir/node$n/log" 2>&1 &
    echo $! >"$dir/node$n/pid"
}

# Node 0 connects to node $1 ($2, its id@address). `garage node id` can
# answer before the node listens (in the VM, seconds before), so this tries
# for up to 60 s.
connect() {
    local out
    for _ in $(seq 120); do
        out=$(cli node connect "$2" 2>&1) && return 0
        sleep 0.5
    done
    fail "node 0 could not connect to node $1 ($2) within 60 s: $out"
}

helper_dir() {
    dir=${HIPOBJ_GARAGE_DIR:-}
    [[ -n "$dir" && -d "$dir" ]] || fail "$1: HIPOBJ_GARAGE_DIR is not set: run this from inside garage-guest.sh's COMMAND"
}

node_arg() {
    [[ "${1:-}" =~ ^[0-2]$ ]] || fail "a node is 0, 1 or 2, not '${1:-}'"
}

case ${1:-} in
    kill-node)
        helper_dir kill-node
        node_arg "${2:-}"
        pid=$(node_pid "$2")
        [[ -n "$pid" ]] && alive "$pid" && kill -KILL "$pid" 2>/dev/null || fail "kill-node: node $2 is not running"
        for _ in $(seq 300); do
            alive "$pid" || break
            sleep 0.1
        done
        alive "$pid" && fail "kill-node: node $2 (pid $pid) still runs 30 s after SIGKILL"
        echo "garage-guest: node $2 (pid $pid) killed"
        exit 0
        ;;
    start-node)
        helper_dir start-node
        node_arg "${2:-}"
        pid=$(node_pid "$2")
        [[ -n "$pid" ]] && alive "$pid" && fail "start-node: node $2 is running (pid $pid)"
        start_node "$2"
        # Back in the cluster at once: node 0 connects to it as at the start
        # (left to itself, a restarted node waits for the others' reconnection
        # back-off, tens of seconds).
        for _ in $(seq 300); do
            id=$("$garage" -c "$dir/node$2/garage.toml" node id -q 2>/dev/null) && break
            sleep 0.2
        done
        [[ -n "${id:-}" ]] || fail "start-node: node $2 did not answer 'garage node id' within 60 s"
        if [[ "$2" != 0 ]]; then
            connect "$2" "$id"
        fi
        echo "garage-guest: node $2 started (pid $(node_pid "$2"))"
        exit 0
        ;;
    rss)
        helper_dir rss
        for ((n = 0; n < nodes; n++)); do
            pid=$(node_pid "$n")
            kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
            echo "node$n ${kib:-0}"
        done
        exit 0
        ;;
esac

dir=""
data=""
own_dir=0
while [[ ${1:-} == --* ]]; do
    case $1 in
        --dir)
            dir=$2
            shift 2
            ;;
        --data)
            data=$2
            shift 2
            ;;
        *) fail "unknown option $1" ;;
    esac
done
(($#)) || fail "usage: garage-guest.sh [--dir DIR] [--data DIR] COMMAND... (or kill-node N, start-node N, rss)"
[[ -x "$garage" ]] || fail "no Garage binary at $garage: run scripts/garage.sh on the host (or set HIPOBJ_GARAGE)"
"$garage" --version | grep -qwF "$version" || fail "$garage is not Garage $version: $("$garage" --version 2>&1 | head -1)"
if [[ -z "$dir" ]]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/hipobj-garage.XXXXXX")
    own_dir=1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
data_dir() {
    if [[ -n "$data" ]]; then echo "$data/garage-node$1"; else echo "$dir/node$1/data"; fi
}

teardown() {
    local status=$? n pid
    for ((n = 0; n < nodes; n++)); do
        pid=$(node_pid "$n")
        [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
    done
    for ((n = 0; n < nodes; n++)); do
        pid=$(node_pid "$n")
        if [[ -n "$pid" ]]; then
            # Garage drains for a moment on SIGTERM; it has five seconds.
            timeout 5 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if ((status != 0)); then
        for ((n = 0; n < nodes; n++)); do
            echo "== garage node $n's warnings and errors, the last 20" >&2
            grep -E ' (WARN|ERROR) ' "$dir/node$n/log" 2>/dev/null | tail -n 20 >&2 || true
        done
    fi
    if [[ -n "$data" ]]; then
        for ((n = 0; n < nodes; n++)); do rm -rf "$(data_dir "$n")"; done
    fi
    if ((own_dir)); then
        rm -rf "$dir"
    fi
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT TERM

start=$EPOCHREALTIME
# One secret for the cluster, made now (32 random bytes, hex), never on a
# command line: it is in the configuration files, readable by their owner only.
secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
umask 077
for ((n = 0; n < nodes; n++)); do
    rm -rf "$(data_dir "$n")"
    mkdir -p "$dir/node$n/meta" "$(data_dir "$n")"
    cat >"$dir/node$n/garage.toml" <<EOF
metadata_dir = "$dir/node$n/meta"
data_dir = "$(data_dir "$n")"
db_engine = "lmdb"
# The lane's tests write random bytes: compressing them would only spend the
# VM's two emulated CPUs.
compression_level = "none"
replication_factor = 3
consistency_mode = "consistent"
rpc_bind_addr = "$ip:$(rpc_port "$n")"
rpc_public_addr = "$ip:$(rpc_port "$n")"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "$ip:$(s3_port "$n")"

[admin]
api_bind_addr = "$ip:$(admin_port "$n")"
EOF
    start_node "$n"
done

# Each node's identity (made at its first start), then node 0 connects to
# the other two; the cluster's gossip does the rest.
declare -a ids
for ((n = 0; n < nodes; n++)); do
    for _ in $(seq 300); do
        ids[n]=$("$garage" -c "$dir/node$n/garage.toml" node id -q 2>/dev/null) && break
        alive "$(node_pid "$n")" || fail "node $n exited at start (log: $dir/node$n/log)"
        sleep 0.2
    done
    [[ -n "${ids[n]:-}" ]] || fail "node $n did not answer 'garage node id' within 60 s"
done
for ((n = 1; n < nodes; n++)); do
    connect "$n" "${ids[n]}"
done
for _ in $(seq 300); do
    up=$(cli status 2>/dev/null | grep -c "$ip:" || true)
    ((up >= nodes)) && break
    sleep 0.2
done
((up >= nodes)) || fail "the nodes did not all see each other within 60 s: $(cli status 2>&1)"

# The layout: each node in a zone of its own, with the same (nominal)
# capacity, so that the three copies of every block are on three nodes.
for ((n = 0; n < nodes; n++)); do
    cli layout assign -z "z$n" -c 10GB "${ids[n]%@*}" >/dev/null
done
cli layout apply --version 1 >/dev/null

# A key and a bucket it may read and write.
key=$(cli key create hipobj-lane)
key_id=$(awk -F': *' '/^Key ID:/ { print $2 }' <<<"$key")
key_secret=$(awk -F': *' '/^Secret key:/ { print $2 }' <<<"$key")
[[ "$key_id" == GK* && -n "$key_secret" ]] || fail "could not read the key from 'garage key create': $key"
cli bucket create hipobj >/dev/null
cli bucket allow --read --write --owner hipobj --key "$key_id" >/dev/null

# Ready when every node's admin API says the cluster is healthy (every
# partition has a quorum with the new layout).
for _ in $(seq 300); do
    ready=0
    for ((n = 0; n < nodes; n++)); do
        curl -fsS -o /dev/null "http://$ip:$(admin_port "$n")/health" 2>/dev/null && ready=$((ready + 1))
    done
    ((ready == nodes)) && break
    sleep 0.2
done
((ready == nodes)) || fail "the cluster did not become healthy within 60 s: $(cli status 2>&1)"

endpoints=""
for ((n = 0; n < nodes; n++)); do
    endpoints+="${endpoints:+ }http://$ip:$(s3_port "$n")"
done
cat >"$dir/env" <<EOF
export HIPOBJ_GARAGE_ENDPOINT=http://$ip:$(s3_port 0)
export HIPOBJ_GARAGE_ENDPOINTS="$endpoints"
export HIPOBJ_GARAGE_REGION=garage
export HIPOBJ_GARAGE_BUCKET=hipobj
export AWS_ACCESS_KEY_ID=$key_id
export AWS_SECRET_ACCESS_KEY=$key_secret
export HIPOBJ_GARAGE_DIR=$dir
EOF
umask 022
# shellcheck disable=SC1091
source "$dir/env"
export HIPOBJ_GARAGE_ENV="$dir/env"
echo "garage-guest: $nodes nodes of Garage $version up in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s, S3 at $endpoints, region garage, bucket hipobj"
status=0
"$@" || status=$?
exit "$status"
