#!/usr/bin/env bash
# hipobj:// through fsspec, pandas and pyarrow (python/hipobj/filesystem.py):
# installs the package with its fsspec extra, and pandas, pyarrow and
# pytest from PyPI, into a fresh venv under the target directory
# (target/fsspec-venv), builds hipobj-s3-server with the suite's feature
# set (scripts/features.sh: CI's build is reused), the release library and
# the fake one (both reused too), and runs:
# - python/tests/test_fsspec.py against the server's local backend on
#   127.0.0.1, with the release libhipobj (no RDMA device here: every byte
#   over plain HTTP, said once);
# - python/tests/test_fsspec_fake.py on the fake libhipobj, whose fake NIC
#   and RDMA S3 server take the RDMA path.
# Each from outside the source tree: the installed package is the one tested.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
venv="$target/fsspec-venv"
python=${PYTHON:-python3}
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "./python[fsspec]" pandas pyarrow pytest
source scripts/features.sh
build_test_server
cargo build --locked --release --lib
cargo build --locked --profile fake -p hipobj-fake
cd "$root/python/tests"
HIPOBJ_S3_SERVER="$target/debug/hipobj-s3-server" HIPOBJ_LIBRARY="$target/release/libhipobj.so" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider test_fsspec.py
HIPOBJ_LIBRARY="$target/fake/libhipobj_fake.so" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider test_fsspec_fake.py
