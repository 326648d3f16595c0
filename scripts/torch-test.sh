#!/usr/bin/env bash
# The PyTorch integration's tests that need no PyTorch and no GPU
# (python/tests/test_torch_s3.py): s3:// URIs, a distributed checkpoint's
# object names and layout, the byte ranges a load reads, and, against a
# real hipobj-s3-server (local backend, --no-rdma), the S3 connector's
# dataset listing and checkpoint streams, through the real libhipobj
# (which finds no RDMA device here, so every transfer is the plain-HTTP
# fallback). The package goes, as the README says, into a venv under the
# target directory (target/pyvenv, scripts/python-test.sh's) with its test
# extra from PyPI. The
# DCP writer and reader run on a GPU machine: scripts/gpu/torch.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
# The Python package's venv (scripts/python-test.sh makes the same one).
venv="$target/pyvenv"
python=${PYTHON:-python3}
# shellcheck source=scripts/features.sh
source scripts/features.sh
# The suite's own feature set: CI's debug build is reused, not redone.
build_test_server
# The release library (the suite's release section built it): no debug
# cdylib of the suite's features to link here.
cargo build --locked --release --lib
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps ./python
"$venv/bin/python" -m pip install --quiet "./python[test]"
# Run from outside the source tree: the installed package is the one tested.
cd "$root/python/tests"
HIPOBJ_LIBRARY="$target/release/libhipobj.so" HIPOBJ_S3_SERVER="$target/debug/hipobj-s3-server" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider test_torch_s3.py
