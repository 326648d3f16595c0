"""``hipobj://`` on the fake libhipobj (``HIPOBJ_LIBRARY``: its fake NIC
and RDMA S3 server, ``conftest.py``): where the library initializes, the
filesystem's reads and writes go by RDMA into and out of host memory, byte
for byte; a server that declines RDMA makes them go over plain HTTP, said
once. The S3 answers come from ``fake_s3.py`` inside the filesystem's own
boto3 client."""

import logging
import random

import pytest
from fake_s3 import FakeS3

from hipobj import filesystem
from hipobj.filesystem import HipObjFileSystem

MIB = 1 << 20


def randbytes(n, seed):
    return random.Random(seed).randbytes(n)


def attached(**options):
    fs = HipObjFileSystem(
        endpoint_url="http://s3.test:9000", key="AK", secret="SK", region="us-east-1",
        config_kwargs={"retries": {"max_attempts": 1}}, skip_instance_cache=True, **options,
    )
    fs.fake = FakeS3()
    fs.fake.attach(fs.client)
    return fs


def test_reads_and_writes_go_by_rdma_where_the_library_initializes(session):
    fs = attached()
    # The process's open session is the one used.
    assert fs.session is session and fs.rdma and fs.http_reason is None
    small, large = randbytes(300000, 1), randbytes(12 * MIB + 5, 2)
    fs.pipe_file("bucket/small.bin", small)
    with fs.open("bucket/large.bin", "wb", block_size=5 * MIB) as f:
        for i in range(0, len(large), MIB):
            f.write(large[i : i + MIB])
    assert fs.fake.objects[("bucket", "small.bin")] == small
    assert fs.fake.objects[("bucket", "large.bin")] == large
    assert fs.cat_file("bucket/small.bin", 1000, -1000) == small[1000:-1000]
    rng = random.Random(3)
    spans = [sorted(rng.randrange(len(large) + 1) for _ in range(2)) for _ in range(20)]
    got = fs.cat_ranges(["bucket/large.bin"] * 20, [a for a, _ in spans], [b for _, b in spans])
    assert got == [large[a:b] for a, b in spans]
    with fs.open("bucket/large.bin", "rb", block_size=2 * MIB) as f:
        f.seek(7 * MIB)
        assert f.read(3 * MIB) == large[7 * MIB : 10 * MIB]
    stats = fs.stats.as_dict()
    # One PUT, three parts; one GET, the ranges (those not empty), the file's blocks.
    assert stats["writes"] == 4 and stats["write_bytes"] == len(small) + len(large)
    assert stats["http"] == 0 and stats["rdma"] == stats["reads"] + stats["writes"]
    assert stats["rdma_bytes"] == stats["read_bytes"] + stats["write_bytes"]
    # Every GET and PUT of bytes carried a token (the HEADs, none).
    moved = [r for r in fs.fake.requests if r[0] in ("GET", "PUT")]
    assert moved and all(token for _, _, token in moved)
    assert all(not token for method, _, token in fs.fake.requests if method == "HEAD")


def test_a_given_session_is_used(session):
    fs = attached(session=session)
    fs.pipe_file("bucket/given.bin", b"by rdma")
    assert fs.cat_file("bucket/given.bin") == b"by rdma"
    assert fs.stats.rdma == 2 and session.stats.rdma >= 2


def test_a_server_that_declines_rdma_is_said_once(session, fake, caplog):
    filesystem._said.clear()
    caplog.set_level(logging.WARNING, logger="hipobj.filesystem")
    assert fake.hipobjFakeSetServerBehaviour(1) == 0
    fs = attached()
    data = randbytes(2 * MIB, 4)
    fs.pipe_file("bucket/declined.bin", data)
    assert fs.cat_ranges(["bucket/declined.bin"] * 3, [0, 10, MIB], [5, 20, None]) == [
        data[:5], data[10:20], data[MIB:]]
    assert fs.cat_file("bucket/declined.bin") == data
    records = [r.getMessage() for r in caplog.records if r.name == "hipobj.filesystem"]
    assert len(records) == 1 and "x-amz-rdma-reply 501" in records[0], records
    assert "x-amz-rdma-reply 501" in fs.http_reason
    assert fs.stats.rdma == 0 and fs.stats.http == 5
    # The library initialized: it is the server that declined.
    assert fs.rdma


def test_an_rdma_read_of_wrong_bytes_is_an_error_not_data(session):
    fs = attached()
    fs.pipe_file("bucket/checked.bin", randbytes(MIB, 5))
    # A server that says it wrote other bytes than it did.
    fs.fake.rdma_checksum = "wrong"
    with pytest.raises(OSError, match="not the bytes the server says it wrote"):
        fs.cat_file("bucket/checked.bin")


def test_gets_reuse_their_registered_buffers(session, fake):
    fs = attached(block_size=MIB)
    data = randbytes(4 * MIB, 6)
    fs.pipe_file("bucket/reused.bin", data)
    assert fs.cat_file("bucket/reused.bin", 0, 300000) == data[:300000]
    # The next registration would fail: a read that registered its buffer
    # again would fall back to HTTP.
    assert fake.hipobjFakeFailCall(b"ibv_reg_mr", 1) == 0
    for at in range(0, 3 * MIB, 512 * 1024):
        assert fs.cat_file("bucket/reused.bin", at, at + 700000) == data[at : at + 700000]
    assert fs.stats.http == 0 and fs.stats.reads == 7
    fake.hipobjFakeClearFaults()
    # A read past what the pool keeps lands in a buffer of its own, once.
    fs._landings = filesystem._Landings(count=16, limit=MIB)
    assert fs.cat_file("bucket/reused.bin") == data and fs.stats.rdma == 9
    assert not fs._landings._free
