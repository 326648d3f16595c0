#!/usr/bin/env bash
# Inside the VM, inside scripts/vm/garage-guest.sh's cluster: the Run:ai
# model streamer (the 0.17.1 wheel's libstreamer.so, driven by ctypes) with
# hipobj's libstreamers3.so, by RDMA through a gateway (`hipobj-s3-server
# --upstream`, on rxe0, in front of Garage's node 0):
# scripts/vm/streamer-lane.py check (the test) or bench (the measurement
# against the wheel's own backend through the same gateway).
#
#   streamer-guest.sh check|bench SERVER_BINARY PYTHON SITE OURS_DIR [ARGS...]
#
# PYTHON: a Python with NumPy and safetensors (the Python package's venv);
# SITE: the directory `pip install --no-deps --target` put the two 0.17.1
# wheels in; OURS_DIR: a directory holding our libstreamers3.so (both made
# on the host by scripts/vm/streamer-prepare.sh: the VM has no network).
# ARGS go to streamer-lane.py (--shards, --shard-mib, --rounds).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
mode="$1"
server_bin="$2"
python="$3"
site="$4"
ours="$5"
shift 5
[[ -n "${HIPOBJ_GARAGE_ENDPOINT:-}" ]] || { echo "streamer-guest: run inside scripts/vm/garage-guest.sh" >&2; exit 1; }
work=$(mktemp -d)
gateway_pid=""
cleanup() {
    [[ -z "$gateway_pid" ]] || kill -KILL "$gateway_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The gateway signs for Garage with Garage's key (in AWS_* now); its
# clients sign with their own.
start=$SECONDS
"$server_bin" --upstream "$HIPOBJ_GARAGE_ENDPOINT" --upstream-region "$HIPOBJ_GARAGE_REGION" \
    --listen 192.0.2.1:9301 --device rxe0 \
    --access-key streamer-lane --secret-key streamer-lane-secret \
    --upstream-timeout-ms 60000 --metrics-listen 192.0.2.1:9401 \
    >"$work/gateway.out" 2>"$work/gateway.log" &
gateway_pid=$!
until grep -q "http://" "$work/gateway.out" 2>/dev/null; do
    if ! kill -0 "$gateway_pid" 2>/dev/null || ((SECONDS - start > 60)); then
        cat "$work/gateway.log" >&2
        echo "streamer-guest: the gateway did not start" >&2
        exit 1
    fi
    sleep 0.2
done
echo "streamer-guest: gateway: $(head -1 "$work/gateway.out")"

status=0
# The outer and both backends read their endpoint, path style and keys from
# the environment, as vLLM leaves them (model-streamer.md §2.4).
env AWS_ENDPOINT_URL=http://192.0.2.1:9301 AWS_ACCESS_KEY_ID=streamer-lane \
    AWS_SECRET_ACCESS_KEY=streamer-lane-secret AWS_REGION=us-east-1 \
    RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 AWS_EC2_METADATA_DISABLED=true \
    HIPOBJ_GARAGE_KEY="$AWS_ACCESS_KEY_ID" HIPOBJ_GARAGE_SECRET="$AWS_SECRET_ACCESS_KEY" \
    HIPOBJ_STREAMER_SITE="$site" HIPOBJ_STREAMER_OURS="$ours" \
    HIPOBJ_STREAMER_METRICS=http://192.0.2.1:9401/metrics PYTHONDONTWRITEBYTECODE=1 TMPDIR="${TMPDIR:-/tmp}" \
    "$python" "$root/scripts/vm/streamer-lane.py" "$mode" "$@" || status=$?
if ((status != 0)); then
    echo "== the gateway's log, the last 20 lines" >&2
    tail -n 20 "$work/gateway.log" >&2
fi
echo "streamer-guest: $mode took $((SECONDS - start)) s (status $status)"
exit "$status"
