#!/usr/bin/env bash
# The Python package on a GPU machine (python/tests/test_gpu.py): PyTorch
# CUDA tensors and CuPy arrays through the package, on the fake libhipobj
# whose GPU is the machine's own (HIPOBJ_FAKE_REAL_GPU=cuda: the fake
# fabric reaches the real device memory), byte for byte against
# safetensors' own loader.
#
#   bash scripts/gpu/python.sh build   here: the fake library
#                                      (target/fake/libhipobj_fake.so) and the
#                                      wheels the GPU machine lacks (boto3
#                                      and its needs, awscrt) under .whl/
#   bash scripts/gpu/python.sh run     there (PyTorch, CuPy, NumPy,
#                                      safetensors and pytest installed):
#                                      installs .whl/ into /tmp/site, runs
#                                      the tests
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
mode=${1:-run}
case "$mode" in
build)
    cargo build --locked --profile fake -p hipobj-fake
    mkdir -p .whl
    python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "boto3>=1.36" "awscrt>=0.23.4"
    # What the machine has already (KINDS.md's list) is not carried.
    rm -f .whl/urllib3-* .whl/python_dateutil-* .whl/six-*
    du -sh .whl target/fake/libhipobj_fake.so
    ;;
run)
    if compgen -G '.whl/*.whl' >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site
    fi
    export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
    export HIPOBJ_LIBRARY="$root/target/fake/libhipobj_fake.so" HIPOBJ_FAKE_REAL_GPU=cuda
    export HIPOBJ_COMPLETION_TIMEOUT_MS=${HIPOBJ_COMPLETION_TIMEOUT_MS:-10000}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c 'import torch, cupy, safetensors, boto3; print("torch", torch.__version__, "cupy", cupy.__version__, "safetensors", safetensors.__version__, "boto3", boto3.__version__)'
    cd python/tests
    python3 -m pytest -q -p no:cacheprovider test_gpu.py
    ;;
*)
    echo "scripts/gpu/python.sh: build or run, not $mode" >&2
    exit 2
    ;;
esac
