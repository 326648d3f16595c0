"""``hipobj://`` on Soft-RoCE (the VM lane only: ``scripts/vm/fsspec-guest.sh``
sets ``HIPOBJ_PYTHON_LANE=1``, the real libhipobj in ``HIPOBJ_LIBRARY`` and
the RDMA S3 server in ``HIPOBJ_S3_SERVER``): pandas and pyarrow through
fsspec against ``hipobj-s3-server`` on rxe0, every object byte by RDMA (the
filesystem's counters and the server's agree, none over HTTP), and the
same reads over plain HTTP with ``rdma=False``. Anywhere else every test
fails. (The two paths timed: ``scripts/vm/fsspec-lane.sh --bench``.)"""

import os
import random

import numpy
import pandas
import pyarrow
import pyarrow.parquet as pq
import pytest

from hipobj.filesystem import HipObjFileSystem
from s3_server import S3Server

MIB = 1 << 20
IP = "192.0.2.1"
ACCESS, SECRET = "fsspec-lane", "fsspec-lane-secret"


@pytest.fixture(scope="module")
def server():
    if os.environ.get("HIPOBJ_PYTHON_LANE") != "1":
        pytest.fail("the fsspec lane tests run in the VM lane (scripts/vm/fsspec-lane.sh)")
    s = S3Server(ACCESS, SECRET, "--device", "rxe0", bucket="bkt", host=IP, metrics=True)
    assert s.rdma, "the server has RDMA on rxe0"
    yield s
    s.stop()


@pytest.fixture
def options(server):
    return {"endpoint_url": server.endpoint, "key": ACCESS, "secret": SECRET, "region": "us-east-1"}


def test_pandas_and_pyarrow_move_every_object_byte_by_rdma(options, server):
    fs = HipObjFileSystem(**options, skip_instance_cache=True, block_size=MIB)
    assert fs.rdma and fs.http_reason is None, fs.http_reason
    rng = numpy.random.default_rng(1)
    df = pandas.DataFrame({"id": numpy.arange(20000), "x": rng.random(20000), "y": rng.random(20000)})
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


def test_the_same_reads_by_rdma_and_over_http(options, server):
    fs = HipObjFileSystem(**options, skip_instance_cache=True)
    plain = HipObjFileSystem(**options, skip_instance_cache=True, rdma=False)
    data = random.Random(3).randbytes(4 * MIB + 3)
    fs.pipe_file("bkt/lane/both.bin", data)
    spans = [(i * MIB, (i + 1) * MIB + 1) for i in range(4)]
    for each in (fs, plain):
        assert each.cat_file("bkt/lane/both.bin") == data
        got = each.cat_ranges(["bkt/lane/both.bin"] * 4, [a for a, _ in spans], [b for _, b in spans])
        assert got == [data[a:b] for a, b in spans]
    assert fs.stats.http == 0 and fs.stats.rdma > 0
    assert plain.stats.rdma == 0 and plain.stats.http > 0
