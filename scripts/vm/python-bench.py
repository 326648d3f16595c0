"""Inside the VM (scripts/vm/python-bench.sh boots it): a model of SHARDS
safetensors shards of SHARD_MIB MiB in the RDMA S3 server on rxe0, loaded
into host memory through the Python package (``hipobj.safetensors
.load_sharded``, every span in flight, at most 16) against the hipobj
command's best throughput for the same objects (``cp --recursive`` with
several splits of jobs and streams), alternating, ROUNDS times, both
checking every byte's CRC-64/NVME; and where the package's time goes per
transfer: its own Python (wall time outside the library call, outside
boto3's request and outside the CRC check), the CRC check, boto3's
request (signing, sending, and waiting for the answer, which the server
sends once its RDMA WRITEs are done), the library call less its
callbacks, and the process's CPU time; then the same load unverified.

Figures on stdout as ``name value unit`` lines.

Usage: python-bench.py SERVER_BINARY HIPOBJ_BINARY [SHARDS [SHARD_MIB [ROUNDS]]]
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import boto3
import numpy
from botocore.config import Config

import hipobj
from hipobj import _session
from hipobj import safetensors as st

server_bin, hipobj_bin = sys.argv[1], sys.argv[2]
shards = int(sys.argv[3]) if len(sys.argv) > 3 else 16
shard_mib = int(sys.argv[4]) if len(sys.argv) > 4 else 64
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
MIB = 1 << 20
ACCESS, SECRET = "bench", "bench-secret-key"


def report(name, value, unit):
    print(f"{name} {value:.3f} {unit}", flush=True)


work = tempfile.mkdtemp(prefix="hipobj-python-bench-")
os.makedirs(f"{work}/root")
server = subprocess.Popen(
    [server_bin, "--root", f"{work}/root", "--listen", "192.0.2.1:0", "--access-key", ACCESS,
     "--secret-key", SECRET, "--bucket", "bucket", "--device", "rxe0"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
)
try:
    m = re.search(r"listening on (http://\S+) \(rdma: ([^)]*)\)", server.stdout.readline())
    assert m and not m.group(2).startswith("off"), "the server has RDMA on rxe0"
    endpoint = m.group(1)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_ENDPOINT_URL=endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=ACCESS,
                      aws_secret_access_key=SECRET, config=Config(retries={"max_attempts": 1},
                                                                  max_pool_connections=32))

    # The model: each shard two tensors, written as files, up by the command.
    import safetensors.numpy

    up = f"{work}/up"
    os.makedirs(up)
    rng = numpy.random.default_rng(1)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        n = (shard_mib * MIB - 4096) // 4
        tensors = {f"l{i}.w": rng.integers(0, 1 << 30, size=n, dtype=numpy.int32).view(numpy.float32),
                   f"l{i}.b": numpy.ones(1000, dtype=numpy.float32)}
        with open(f"{up}/{name}", "wb") as f:
            f.write(safetensors.numpy.save(tensors))
        weight_map.update({k: name for k in tensors})
    with open(f"{up}/model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": weight_map}, f)
    subprocess.run([hipobj_bin, "cp", "-r", up, "s3://bucket/model", "--jobs", "4", "--no-progress"],
                   env=env, check=True, stderr=subprocess.DEVNULL)
    total = sum(os.path.getsize(f"{up}/{n}") for n in os.listdir(up) if n.endswith(".safetensors"))
    shutil.rmtree(up)
    report("python_model_bytes", total / MIB, "MiB")

    def command(jobs, streams, chunk):
        out = f"{work}/down"
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run(
            [hipobj_bin, "cp", "-r", "s3://bucket/model", out, "--jobs", str(jobs), "--streams", str(streams),
             "--chunk", chunk, "--json", "--no-progress"],
            env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        summary = json.loads(done.stdout)
        shutil.rmtree(out, ignore_errors=True)
        # The index is part of the copy: its bytes are a few KiB.
        return summary["mib_per_s"]

    # Where the package's time goes, per transfer: wall time, and this
    # thread's CPU time (every step of a transfer runs on one transfer
    # thread, so the differences attribute the CPU exactly).
    times = {}
    lock = threading.Lock()

    def timed(key, fn):
        def wrapper(*a, **k):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    times[key] = times.get(key, 0.0) + time.perf_counter() - wall
                    times[key + "_cpu"] = times.get(key + "_cpu", 0.0) + time.thread_time() - cpu
                    if key == "call":
                        times["n"] = times.get("n", 0) + 1

        return wrapper

    run = _session.Session._run

    def timed_run(self, op, base, offset, length, call, ask):
        return timed("native", run)(self, op, base, offset, length, timed("boto", call), ask)

    _session.Session.get_object = timed("call", _session.Session.get_object)
    _session.Session._run = timed_run
    _session._Exchange._send = timed("send", _session._Exchange._send)
    _session.Session._verify_rdma = timed("crc", _session.Session._verify_rdma)

    splits = [(4, 4, "16MiB"), (16, 1, "64MiB"), (8, 2, "32MiB")]
    with hipobj.Session(nic="rxe0", require=True, max_in_flight=16) as session:
        for r in range(1, rounds + 1):
            best = 0.0
            for jobs, streams, chunk in splits:
                rate = command(jobs, streams, chunk)
                report(f"command_jobs{jobs}_streams{streams}_chunk{chunk}_r{r}", rate, "MiB/s")
                best = max(best, rate)
            report(f"command_best_r{r}", best, "MiB/s")
            times.clear()
            cpu = time.process_time()
            t = time.perf_counter()
            loaded = st.load_sharded(s3, "bucket", "model/model.safetensors.index.json", session=session,
                                     span=16 * MIB)
            seconds = time.perf_counter() - t
            cpu = time.process_time() - cpu
            assert len(loaded) == 2 * shards
            del loaded
            rate = total / MIB / seconds
            report(f"python_load_r{r}", rate, "MiB/s")
            report(f"python_over_command_best_r{r}", rate / best, "ratio")
            n = max(times.get("n", 0), 1)
            report(f"python_transfers_r{r}", n, "count")
            for suffix, unit in (("", "wall"), ("_cpu", "cpu")):
                t = {k: times.get(k + suffix, 0.0) for k in ("call", "native", "send", "boto", "crc")}
                own = (t["call"] - t["native"] - t["crc"]) + (t["send"] - t["boto"])
                report(f"python_own_{unit}_per_transfer_r{r}", own / n * 1e6, "us")
                report(f"python_crc_check_{unit}_per_transfer_r{r}", t["crc"] / n * 1e6, "us")
                report(f"python_boto3_request_{unit}_per_transfer_r{r}", t["boto"] / n * 1e6, "us")
                report(f"python_library_call_less_callbacks_{unit}_per_transfer_r{r}",
                       (t["native"] - t["send"]) / n * 1e6, "us")
            report(f"python_process_cpu_per_transfer_r{r}", cpu / n * 1e6, "us")
            # The same without the CRC checks, to show what they cost.
            t = time.perf_counter()
            loaded = st.load_sharded(s3, "bucket", "model/model.safetensors.index.json", session=session,
                                     span=16 * MIB, verify=False)
            seconds = time.perf_counter() - t
            del loaded
            report(f"python_load_unverified_r{r}", total / MIB / seconds, "MiB/s")
        assert session.stats.fallback == 0, session.stats
finally:
    server.terminate()
    server.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)
