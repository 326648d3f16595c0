#!/usr/bin/env bash
# Inside the VM (scripts/vm/lane.sh): the Python package's lane tests
# (python/tests/test_lane.py) with the venv scripts/python-test.sh made on
# the host, the release libhipobj and the RDMA S3 server the lane built.
#
# Usage: python-guest.sh LIBHIPOBJ SERVER_BINARY
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/target/pyvenv"
[[ -x "$venv/bin/python" ]] || { echo "python-guest: $venv is missing: run scripts/python-test.sh first" >&2; exit 1; }
cd "$root/python/tests"
# The root file system is the host's, read-only: no bytecode or pytest cache.
HIPOBJ_PYTHON_LANE=1 HIPOBJ_LIBRARY="$1" HIPOBJ_S3_SERVER="$2" PYTHONDONTWRITEBYTECODE=1 TMPDIR="${TMPDIR:-/tmp}" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider test_lane.py
