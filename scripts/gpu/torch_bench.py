"""Save and load figures of hipobj.dcp on a GPU machine (scripts/gpu/torch.sh):
a state dict of CUDA tensors (TOTAL_MIB, in TENSOR_MIB tensors) saved with
HipObjStorageWriter and loaded with HipObjStorageReader against
hipobj-s3-server (HIPOBJ_S3_SERVER, local backend in /dev/shm), and with
DCP's FileSystemWriter/Reader in /dev/shm for comparison. Prints one JSON
line with GiB/s and the session's stats (which path the bytes took)."""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import boto3
import torch
import torch.distributed.checkpoint as dcp
from botocore.config import Config

import hipobj
from hipobj.dcp import HipObjStorageReader, HipObjStorageWriter

MIB = 1 << 20
total = int(os.environ.get("TOTAL_MIB", "2048"))
each = int(os.environ.get("TENSOR_MIB", "256"))
root = tempfile.mkdtemp(prefix="hipobj-bench-", dir="/dev/shm")
secret = os.path.join(root, "secret")
with open(secret, "w") as f:
    f.write("bench-secret\n")
os.chmod(secret, 0o600)
server = subprocess.Popen([os.environ["HIPOBJ_S3_SERVER"], "--root", os.path.join(root, "store"), "--listen",
                           "127.0.0.1:0", "--access-key", "bench", "--secret-key-file", secret, "--bucket", "bucket",
                           "--no-rdma", "--http-max-connections", "1024"], stdout=subprocess.PIPE, text=True)
endpoint = re.search(r"listening on (http://\S+)", server.stdout.readline()).group(1)
client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                      aws_secret_access_key="bench-secret", config=Config(max_pool_connections=64))
state = {f"layer{i}.weight": torch.randn(each * MIB // 4, device="cuda") for i in range(total // each)}
nbytes = sum(t.numel() * t.element_size() for t in state.values())
gib = nbytes / (1 << 30)
results = {"bytes": nbytes, "tensors": len(state), "tensor_mib": each}
torch.cuda.synchronize()
with hipobj.Session() as session:
    results["session_available"] = session.available
    results["session_reason"] = session.reason
    for run in range(2):
        uri = f"s3://bucket/bench/{run}"
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=HipObjStorageWriter(uri, client=client, session=session, thread_count=8))
        t1 = time.perf_counter()
        back = {k: torch.empty_like(v) for k, v in state.items()}
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        dcp.load(back, storage_reader=HipObjStorageReader(uri, client=client, session=session))
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        assert all(torch.equal(back[k], v) for k, v in state.items())
        results[f"hipobj_save_gib_s_{run}"] = round(gib / (t1 - t0), 3)
        results[f"hipobj_load_gib_s_{run}"] = round(gib / (t3 - t2), 3)
        fs = os.path.join(root, f"fs-{run}")
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(fs, thread_count=8))
        t1 = time.perf_counter()
        back = {k: torch.empty_like(v) for k, v in state.items()}
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        dcp.load(back, storage_reader=dcp.FileSystemReader(fs))
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        results[f"filesystem_shm_save_gib_s_{run}"] = round(gib / (t1 - t0), 3)
        results[f"filesystem_shm_load_gib_s_{run}"] = round(gib / (t3 - t2), 3)
    s = session.stats
    results["stats"] = {"rdma": s.rdma, "rdma_bytes": s.rdma_bytes, "fallback": s.fallback,
                        "fallback_bytes": s.fallback_bytes, "failed": s.failed}
server.terminate()
server.wait()
print(json.dumps(results))
