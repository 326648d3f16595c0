#!/usr/bin/env bash
# NIXL's stock OBJ backend against hipobj-s3-server: installs NumPy, pytest
# and NIXL's published wheels (nixl-cu12 and the nixl meta package 1.5.1,
# without their dependencies: no torch, no CUDA) into a venv under the
# target directory, builds the server with the suite's features (so that
# CI's earlier build is reused), and runs tests/python/test_nixl_obj.py,
# which starts the servers it drives (a local gateway, and a gateway in
# front of a second server as its upstream store) and stops them.
#
#   nixl-test.sh [PYTEST-ARGS]...
#
# Never nixl-cu13: where no CUDA is found, the meta package would load
# nixl_cu13, whose OBJ plugin needs NVIDIA's cuObject library.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac

source scripts/features.sh
build_test_server

venv="$target/nixl-venv"
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    nixl-cu12==1.5.1 nixl==1.5.1
if "$venv/bin/python" -m pip show --quiet nixl-cu13 2>/dev/null; then
    echo "nixl-test.sh: nixl-cu13 is installed in $venv; remove the venv and run again" >&2
    exit 1
fi

# The servers' roots, secrets and logs: removed whatever happens. The
# servers themselves are the test process's children, stopped by it, and
# sent SIGTERM by the kernel should it die first.
mkdir -p "$target/tmp"
work=$(mktemp -d "$target/tmp/nixl-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HIPOBJ_S3_SERVER="$target/debug/hipobj-s3-server"
cd "$root/tests/python"
"$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$work" test_nixl_obj.py "$@"
