#!/usr/bin/env bash
# PyTorch on a GPU machine (python/tests/test_gpu_torch.py, then
# scripts/gpu/torch_bench.py): distributed checkpoints through hipobj.dcp
# into CUDA tensors byte for byte against DCP's FileSystemWriter/Reader and
# torch.save, a checkpoint sharded over two ranks, the S3 connector's names,
# against hipobj-s3-server (local backend in /dev/shm) with the release
# libhipobj. Such a machine has no RDMA device: the library does not
# initialize, and the bytes go over plain HTTP, landed in GPU memory by
# the CUDA driver's copies (Session.stats says so).
#
#   bash scripts/gpu/torch.sh build   here: the release libhipobj.so and
#                                     hipobj-s3-server (stripped) into
#                                     target/gpu-torch/, and the wheels the
#                                     GPU machine lacks (boto3 and its
#                                     needs, awscrt) into .whl/
#   bash scripts/gpu/torch.sh run     there (PyTorch and pytest installed):
#                                     installs .whl/ into /tmp/site, runs
#                                     the tests and the figures; with $OUT
#                                     set, their logs go there
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
mode=${1:-run}
case "$mode" in
build)
    target="${CARGO_TARGET_DIR:-target}"
    case "$target" in /*) ;; *) target="$root/$target" ;; esac
    cargo build --locked --release --features s3-server --lib --bin hipobj-s3-server
    mkdir -p target/gpu-torch .whl
    cp "$target/release/libhipobj.so" "$target/release/hipobj-s3-server" target/gpu-torch/
    strip target/gpu-torch/libhipobj.so target/gpu-torch/hipobj-s3-server
    python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "boto3>=1.36" "awscrt>=0.23.4"
    # What the machine has already (KINDS.md's list) is not carried.
    rm -f .whl/urllib3-* .whl/python_dateutil-* .whl/six-*
    du -sh .whl target/gpu-torch/*
    ;;
run)
    out=${OUT:-/tmp/hipobj-torch-out}
    mkdir -p "$out"
    if compgen -G '.whl/*.whl' >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site
    fi
    export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export HIPOBJ_LIBRARY="$root/target/gpu-torch/libhipobj.so" HIPOBJ_S3_SERVER="$root/target/gpu-torch/hipobj-s3-server"
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
        ldd --version | head -1
        "$HIPOBJ_S3_SERVER" --version
        ls /sys/class/infiniband 2>/dev/null || echo "no RDMA device (/sys/class/infiniband absent)"
        python3 -c 'import torch, boto3, hipobj; print("torch", torch.__version__, "boto3", boto3.__version__, "libhipobj", hipobj.version())'
    } 2>&1 | tee "$out/machine.txt"
    status=0
    (cd python/tests && python3 -m pytest -v -s -p no:cacheprovider test_gpu_torch.py) 2>&1 | tee "$out/tests.log" || status=1
    python3 scripts/gpu/torch_bench.py 2>&1 | tee "$out/bench.json" || status=1
    exit "$status"
    ;;
*)
    echo "scripts/gpu/torch.sh: build or run, not $mode" >&2
    exit 2
    ;;
esac
