#!/usr/bin/env bash
# Inside the VM (scripts/vm/fsspec-lane.sh, scripts/vm/lane.sh): hipobj://
# through fsspec, pandas and pyarrow by RDMA (python/tests/test_fsspec_lane.py),
# with the venv scripts/fsspec-test.sh made on the host, the release
# libhipobj and the RDMA S3 server; with --bench, the timed reads of
# scripts/vm/fsspec-bench.py after them.
#
# Usage: fsspec-guest.sh VENV LIBHIPOBJ SERVER_BINARY [--bench]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv=$1
[[ -x "$venv/bin/python" ]] || { echo "fsspec-guest: $venv is missing: run scripts/fsspec-test.sh first" >&2; exit 1; }
# The root file system is the host's, read-only: no bytecode or pytest cache.
export HIPOBJ_PYTHON_LANE=1 HIPOBJ_LIBRARY="$2" HIPOBJ_S3_SERVER="$3" PYTHONDONTWRITEBYTECODE=1 TMPDIR="${TMPDIR:-/tmp}"
(cd "$root/python/tests" && "$venv/bin/python" -m pytest -q -s -p no:cacheprovider --durations=3 test_fsspec_lane.py)
if [[ ${4:-} == --bench ]]; then
    "$venv/bin/python" "$root/scripts/vm/fsspec-bench.py"
fi
