"""``hipobj://`` on Soft-RoCE (the VM lane only: ``scripts/vm/fsspec-guest.sh``
sets ``HIPOBJ_PYTHON_LANE=1``, the real libhipobj in ``HIPOBJ_LIBRARY`` and
the RDMA S3 server in ``HIPOBJ_S3_SERVER``): pandas and pyarrow through
fsspec against ``hipobj-s3-server`` on rxe0, every object byte by RDMA (the
filesystem's counters and the server's agree, none over HTTP), and the
same reads over plain HTTP with ``rdma=False``, timed. Anywhere else every
test fails."""

import os
import random
import re
import subprocess
import tempfile
import time
import urllib.request

import numpy
import pandas
import pyarrow
import pyarrow.parquet as pq
import pytest

from hipobj.filesystem import HipObjFileSystem

MIB = 1 << 20
IP = "192.0.2.1"
ACCESS, SECRET = "fsspec-lane", "fsspec-lane-secret"


class Server:
    """hipobj-s3-server on rxe0 with bucket ``bkt`` in a fresh root, and its
    metrics."""

    def __init__(self) -> None:
        binary = os.environ.get("HIPOBJ_S3_SERVER")
        if os.environ.get("HIPOBJ_PYTHON_LANE") != "1" or not binary:
            pytest.fail("the fsspec lane tests run in the VM lane (scripts/vm/fsspec-lane.sh)")
        self.root = tempfile.mkdtemp(prefix="hipobj-fsspec-lane-")
        self.proc = subprocess.Popen(
            [binary, "--root", self.root, "--listen", f"{IP}:0", "--metrics-listen", f"{IP}:0",
             "--access-key", ACCESS, "--secret-key", SECRET, "--bucket", "bkt", "--device", "rxe0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        first, second = self.proc.stdout.readline(), self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+) \(rdma: ([^)]*)\)", first)
        metrics = re.search(r"metrics on (http://\S+)", second)
        assert m and metrics, f"the server's first lines: {first!r} {second!r}"
        assert not m.group(2).startswith("off"), f"the server has RDMA on rxe0: {first!r}"
        self.endpoint, self.metrics_url = m.group(1), metrics.group(1)

    def moved(self, path: str, op: str) -> float:
        """``hipobj_s3_bytes_total`` of `op` by `path` (``rdma``, ``http``)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=30).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("hipobj_s3_bytes_total{") and f'op="{op}"' in line and f'path="{path}"' in line
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def options(server):
    return {"endpoint_url": server.endpoint, "key": ACCESS, "secret": SECRET, "region": "us-east-1"}


def test_pandas_and_pyarrow_move_every_object_byte_by_rdma(options, server):
    fs = HipObjFileSystem(**options, skip_instance_cache=True, block_size=MIB)
    assert fs.rdma and fs.http_reason is None, fs.http_reason
    rng = numpy.random.default_rng(1)
    df = pandas.DataFrame({"id": numpy.arange(200000), "x": rng.random(200000), "y": rng.random(200000)})
    df.to_parquet("hipobj://bkt/lane/frame.parquet", storage_options=options)
    pandas.testing.assert_frame_equal(pandas.read_parquet("hipobj://bkt/lane/frame.parquet", storage_options=options), df)
    df.to_csv("hipobj://bkt/lane/frame.csv", index=False, storage_options=options)
    pandas.testing.assert_frame_equal(pandas.read_csv("hipobj://bkt/lane/frame.csv", storage_options=options), df)
    table = pyarrow.table({name: rng.random(MIB // 4) for name in ("a", "b", "c")})
    pq.write_table(table, "bkt/lane/wide.parquet", filesystem=fs, compression="none")
    size = fs.info("bkt/lane/wide.parquet")["size"]
    before = fs.stats.read_bytes
    assert pq.read_table("bkt/lane/wide.parquet", filesystem=fs, columns=["b"]).column("b").equals(table.column("b"))
    assert size // 3 < fs.stats.read_bytes - before < size // 2
    data = random.Random(2).randbytes(9 * MIB + 7)
    with fs.open("bkt/lane/large.bin", "wb", block_size=5 * MIB) as f:
        f.write(data)
    spans = [sorted(random.Random(i).randrange(len(data)) for _ in range(2)) for i in range(16)]
    assert fs.cat_ranges(["bkt/lane/large.bin"] * 16, [a for a, _ in spans], [b for _, b in spans]) == [
        data[a:b] for a, b in spans]
    stats = fs.stats.as_dict()
    assert stats["rdma"] > 0 and stats["http"] == 0, stats
    assert fs.http_reason is None
    # The server saw those bytes by RDMA (pandas' own filesystems are
    # other instances: the server counts theirs too).
    assert server.moved("rdma", "GetObject") >= stats["read_bytes"]
    assert server.moved("http", "GetObject") == 0 and server.moved("http", "PutObject") == 0


def test_the_same_reads_by_rdma_and_over_http_timed(options, server):
    fs = HipObjFileSystem(**options, skip_instance_cache=True)
    plain = HipObjFileSystem(**options, skip_instance_cache=True, rdma=False)
    data = random.Random(3).randbytes(64 * MIB)
    fs.pipe_file("bkt/lane/timed.bin", data)
    ranges = [(i * MIB, (i + 1) * MIB) for i in range(64)]
    for name, each in (("rdma", fs), ("http", plain)):
        start = time.perf_counter()
        assert each.cat_file("bkt/lane/timed.bin") == data
        whole = time.perf_counter() - start
        start = time.perf_counter()
        got = each.cat_ranges(["bkt/lane/timed.bin"] * 64, [a for a, _ in ranges], [b for _, b in ranges])
        spans = time.perf_counter() - start
        assert b"".join(got) == data
        print(f"fsspec-lane {name}: cat_file of 64 MiB {whole:.2f} s ({64 / whole:.0f} MiB/s), "
              f"cat_ranges of 64 x 1 MiB {spans:.2f} s ({64 / spans:.0f} MiB/s)")
    assert fs.stats.http == 0 and plain.stats.rdma == 0
