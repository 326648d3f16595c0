#!/usr/bin/env bash
# Inside the VM: starts the lane's three-node Garage cluster
# (garage-guest.sh) and checks it over plain S3 with boto3 from the venv
# scripts/python-test.sh made (scripts/vm/garage-check.py: small objects, a
# wrong checksum refused, multipart, BIG_MIB streamed each way, one node
# killed and brought back), then tears it down. On the host:
#
#   flock /tmp/hipobj-vm.lock bash scripts/vm/run.sh bash scripts/vm/garage-check.sh [BIG_MIB]
#
# BIG_MIB defaults to 3072 (3 GiB). The cluster's data lives under
# target/vm/out (the VM's writable directory on the host's disk: three
# copies of BIG_MIB would not fit in the guest's memory), its metadata in
# the guest's /tmp.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
venv="$target/pyvenv"
"$venv/bin/python" -c 'import boto3' 2>/dev/null ||
    { echo "garage-check: no boto3 in $venv: run scripts/python-test.sh on the host first" >&2; exit 1; }
big_mib=${1:-3072}
# The root file system is the host's, read-only: no bytecode.
export PYTHONDONTWRITEBYTECODE=1
data="$root/target/vm/out"
[[ -d "$data" && -w "$data" ]] || { echo "garage-check: $data is not a writable directory (run.sh shares it with the VM)" >&2; exit 1; }
exec bash "$root/scripts/vm/garage-guest.sh" --data "$data" "$venv/bin/python" "$root/scripts/vm/garage-check.py" "$big_mib"
