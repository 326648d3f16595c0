"""The package on Soft-RoCE (the VM lane only: ``scripts/vm/python-guest.sh``
sets ``HIPOBJ_PYTHON_LANE=1``, the real libhipobj in ``HIPOBJ_LIBRARY`` and
the RDMA S3 server in ``HIPOBJ_S3_SERVER``): a boto3 client moving NumPy
arrays to and from ``hipobj-s3-server`` on rxe0 by RDMA, byte-exact, whole,
ranged and multipart; a session opened with no arguments on this host
without a GPU; and the fallback against a server started with
``--no-rdma``. Anywhere else every test fails."""

import os

import numpy
import pytest

import hipobj
from s3_server import S3Server

MIB = 1 << 20
IP = "192.0.2.1"
ACCESS, SECRET = "python-lane", "python-lane-secret"


def pattern(n, seed):
    return (numpy.arange(n, dtype=numpy.uint64) * 2654435761 + seed).astype(numpy.uint8)


def lane_server(*extra):
    if os.environ.get("HIPOBJ_PYTHON_LANE") != "1":
        pytest.fail("the lane's Python tests run in the VM lane (scripts/vm/python-guest.sh)")
    return S3Server(ACCESS, SECRET, *extra, host=IP)


@pytest.fixture
def rdma_server():
    server = lane_server("--device", "rxe0")
    assert server.rdma, "the server has RDMA on rxe0"
    yield server
    server.stop()


@pytest.fixture
def plain_server():
    server = lane_server("--no-rdma")
    yield server
    server.stop()


@pytest.fixture
def session():
    with hipobj.Session(nic="rxe0", require=True) as s:
        yield s


def test_numpy_arrays_move_by_rdma_whole_ranged_and_multipart(rdma_server, session):
    s3 = rdma_server.client()
    data = pattern(12 * MIB + 7, 1)
    t = session.put_object(s3, Bucket="bucket", Key="whole", source=data)
    assert t.path == "rdma", t
    assert rdma_server.stored("whole") == data.tobytes()

    into = numpy.zeros(data.size, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="whole", into=into)
    assert (t.path, t.bytes) == ("rdma", data.size)
    assert numpy.array_equal(into, data)

    part = numpy.zeros(MIB, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="whole", into=part, Range=f"bytes={3 * MIB + 1}-{4 * MIB}")
    assert t.path == "rdma" and numpy.array_equal(part, data[3 * MIB + 1 : 4 * MIB + 1])

    t = session.upload(s3, Bucket="bucket", Key="parts", source=data, part_size=5 * MIB)
    assert (t.path, t.parts) == ("rdma", 3)
    assert rdma_server.stored("parts") == data.tobytes()
    into[:] = 0
    session.get_object(s3, Bucket="bucket", Key="parts", into=into)
    assert numpy.array_equal(into, data)
    # PUT, GET, ranged GET, three parts, GET.
    assert session.stats.fallback == 0 and session.stats.rdma == 7


def test_a_session_without_arguments_uses_rdma_on_a_host_without_a_gpu(rdma_server):
    # The VM has rxe0 and no GPU: hipObjInit without a NIC fails there,
    # and the session names the NICs with an active port itself.
    s3 = rdma_server.client()
    with hipobj.Session(require=True) as session:
        assert "rxe0" in session.nic.split(","), session.nic
        data = pattern(MIB, 3)
        t = session.put_object(s3, Bucket="bucket", Key="host-only", source=data, strict=True)
        assert t.path == "rdma" and rdma_server.stored("host-only") == data.tobytes()
        into = numpy.zeros(MIB, dtype=numpy.uint8)
        assert session.get_object(s3, Bucket="bucket", Key="host-only", into=into, strict=True).path == "rdma"
        assert numpy.array_equal(into, data)


def test_a_server_without_rdma_is_a_visible_fallback_and_strict_refuses_it(plain_server, session):
    s3 = plain_server.client()
    data = pattern(3 * MIB, 2)
    t = session.put_object(s3, Bucket="bucket", Key="plain", source=data)
    assert t.path == "fallback" and "501" in t.reason
    assert plain_server.stored("plain") == data.tobytes()
    into = numpy.zeros(data.size, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="plain", into=into)
    assert t.path == "fallback" and numpy.array_equal(into, data)
    with pytest.raises(hipobj.TransferError, match="strict"):
        session.put_object(s3, Bucket="bucket", Key="strict", source=data, strict=True)
    assert not plain_server.path("strict").exists()


def test_many_in_flight_and_a_sharded_model_by_rdma(rdma_server):
    import json

    import safetensors.numpy

    from hipobj import safetensors as st

    s3 = rdma_server.client()
    with hipobj.Session(nic="rxe0", require=True, max_in_flight=16) as session:
        datas = [pattern(MIB + i, 50 + i) for i in range(16)]
        puts = session.put_objects(s3, [dict(Bucket="bucket", Key=f"many/{i}", source=d) for i, d in enumerate(datas)])
        assert [t.path for t in puts] == ["rdma"] * 16
        intos = [numpy.zeros(d.size, dtype=numpy.uint8) for d in datas]
        futures = [session.get_object_async(s3, Bucket="bucket", Key=f"many/{i}", into=b) for i, b in enumerate(intos)]
        assert all(f.result().path == "rdma" and f.result().verified for f in hipobj.as_completed(futures))
        assert all(numpy.array_equal(a, b) for a, b in zip(intos, datas))

        # A model of four shards: each written by parallel parts, all loaded
        # together through the index, byte for byte as safetensors loads it.
        rng = numpy.random.default_rng(5)
        weight_map, shards = {}, []
        for i in range(4):
            shard = {f"l{i}.w": rng.standard_normal((1024, 1536)).astype(numpy.float32),
                     f"l{i}.b": rng.standard_normal(1536).astype(numpy.float16)}
            name = f"model-{i + 1:05d}-of-00004.safetensors"
            t = st.save(s3, shard, "bucket", f"llm/{name}", session=session, part_size=5 * MIB, jobs=2)
            assert (t.path, t.parts) == ("rdma", 2), t
            assert safetensors.numpy.load(rdma_server.stored(f"llm/{name}")).keys() == shard.keys()
            shards.append(shard)
            weight_map.update({k: name for k in shard})
        s3.put_object(Bucket="bucket", Key="llm/model.safetensors.index.json",
                      Body=json.dumps({"weight_map": weight_map}).encode())
        before = session.stats.rdma
        loaded = st.load_sharded(s3, "bucket", "llm/model.safetensors.index.json", session=session, span=2 * MIB)
        assert session.stats.rdma - before >= 12 and session.stats.fallback == 0
        for shard in shards:
            for k, v in shard.items():
                assert loaded[k].dtype == v.dtype and numpy.array_equal(loaded[k], v), k
