#!/usr/bin/env bash
# The Python package (python/): installs it, as the README says, into a
# venv under target/pyvenv with its test dependencies (boto3, NumPy, pytest
# from PyPI), builds the fake library (cargo build --profile fake -p
# hipobj-fake: target/fake/libhipobj_fake.so), and runs its unit tests there (python/tests/test_fake.py:
# a real boto3 client whose S3 answers from tests/fake_s3.py, on the fake
# library), and its packaging tests (python/tests/test_package.py: its
# metadata, and that building it writes nothing into its sources). The
# lane's tests (test_lane.py) run in the VM
# (scripts/vm/python-guest.sh), with the venv this script leaves.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
venv="$target/pyvenv"
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "./python[test]"
cargo build --locked --profile fake -p hipobj-fake
# Run from outside the source tree: the installed package is the one tested.
cd "$root/python/tests"
HIPOBJ_LIBRARY="$target/fake/libhipobj_fake.so" "$venv/bin/python" -m pytest -q -p no:cacheprovider test_fake.py test_safetensors.py test_package.py
