"""``hipobj://`` through fsspec, pandas and pyarrow (their own packages,
from PyPI) against a real ``hipobj-s3-server`` (local backend, in a fresh
root; ``HIPOBJ_S3_SERVER`` names the binary: ``scripts/fsspec-test.sh``
builds it and sets it). This host has no RDMA device, so every byte goes
over plain HTTP, said once; ``test_fsspec_fake.py`` shows the RDMA path.

Run by its own path, in its own process (the library is chosen per
process): ``HIPOBJ_LIBRARY`` is the real libhipobj here, which loads and
does not initialize without a GPU or an RDMA device."""

import importlib.metadata
import io
import logging
import pathlib
import random
import time

import botocore.loaders
import fsspec
import numpy
import pandas
import pyarrow
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FSSpecHandler, PyFileSystem

import hipobj
from hipobj import filesystem
from hipobj.filesystem import HipObjFileSystem
from s3_server import S3Server

MIB = 1 << 20
ACCESS, SECRET = "fsspec-test", "fsspec-test-secret"
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    s = S3Server(ACCESS, SECRET, bucket="bkt", metrics=True, log=True)
    yield s
    s.stop()


@pytest.fixture
def options(server):
    return {"endpoint_url": server.endpoint, "key": ACCESS, "secret": SECRET, "region": "us-east-1"}


@pytest.fixture
def fs(options):
    return HipObjFileSystem(**options, skip_instance_cache=True)


def randbytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# ---------------------------------------------------------------- fsspec


def test_the_protocol_resolves_through_the_installed_entry_point(options):
    # The package under test is the installed one, not the checkout's.
    assert not pathlib.Path(hipobj.__file__).resolve().is_relative_to(REPO / "python")
    points = importlib.metadata.entry_points(group="fsspec.specs")
    assert [p.value for p in points if p.name == "hipobj"] == ["hipobj.filesystem:HipObjFileSystem"]
    assert fsspec.get_filesystem_class("hipobj") is HipObjFileSystem
    fs = fsspec.filesystem("hipobj", **options)
    assert isinstance(fs, HipObjFileSystem)
    data = randbytes(70000, 1)
    with fsspec.open("hipobj://bkt/entry/one.bin", "wb", **options) as f:
        f.write(data)
    with fsspec.open("hipobj://bkt/entry/one.bin", "rb", **options) as f:
        assert f.read() == data
    assert fs.cat("hipobj://bkt/entry/one.bin") == data


def test_ls_info_exists_find_glob_and_no_op_directories(fs):
    fs.pipe({"bkt/tree/a/b/c.txt": b"c", "bkt/tree/a/d.txt": b"dd", "bkt/tree/e.bin": b"eee"})
    assert fs.ls("bkt/tree", detail=False) == ["bkt/tree/a", "bkt/tree/e.bin"]
    detail = {e["name"]: e for e in fs.ls("hipobj://bkt/tree/a")}
    assert detail["bkt/tree/a/b"]["type"] == "directory"
    assert (detail["bkt/tree/a/d.txt"]["type"], detail["bkt/tree/a/d.txt"]["size"]) == ("file", 2)
    # An object lists itself; the root lists the buckets.
    assert fs.ls("bkt/tree/e.bin", detail=False) == ["bkt/tree/e.bin"]
    assert "bkt" in fs.ls("", detail=False)
    info = fs.info("bkt/tree/e.bin")
    assert (info["type"], info["size"]) == ("file", 3) and info["ETag"].startswith('"')
    assert fs.info("bkt/tree/a")["type"] == "directory" and fs.info("bkt")["type"] == "directory"
    assert fs.isdir("bkt/tree/a/b") and fs.isfile("bkt/tree/a/b/c.txt")
    assert fs.exists("bkt/tree/a/d.txt") and not fs.exists("bkt/tree/nothing")
    assert fs.find("bkt/tree") == ["bkt/tree/a/b/c.txt", "bkt/tree/a/d.txt", "bkt/tree/e.bin"]
    assert fs.glob("bkt/tree/**/*.txt") == ["bkt/tree/a/b/c.txt", "bkt/tree/a/d.txt"]
    assert fs.glob("hipobj://bkt/tree/*.bin") == ["bkt/tree/e.bin"]
    assert fs.modified("bkt/tree/e.bin") is not None
    fs.mkdir("bkt/tree/new")
    fs.makedirs("bkt/tree/new/deeper", exist_ok=True)
    assert fs.ls("bkt/tree", detail=False) == ["bkt/tree/a", "bkt/tree/e.bin"]
    with pytest.raises(FileNotFoundError):
        fs.ls("bkt/tree/nothing")


def test_cat_file_slices_as_python_does(fs):
    data = randbytes(3 * MIB + 17, 2)
    fs.pipe_file("bkt/slices.bin", data)
    for start, end in [(None, None), (0, 10), (5, -5), (-100, None), (None, -3), (3 * MIB, 4 * MIB), (10, 10),
                       (4 * MIB, None), (-(5 * MIB), 7)]:
        assert fs.cat_file("bkt/slices.bin", start, end) == data[start:end], (start, end)


def test_cat_ranges_byte_exact_several_in_flight(fs):
    one, two = randbytes(4 * MIB + 3, 3), randbytes(MIB, 4)
    fs.pipe({"bkt/ranges/one": one, "bkt/ranges/two": two})
    rng = random.Random(5)
    paths, starts, ends, expected = [], [], [], []
    for _ in range(40):
        name, data = rng.choice([("bkt/ranges/one", one), ("hipobj://bkt/ranges/two", two)])
        a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        paths.append(name), starts.append(a), ends.append(b), expected.append(data[a:b])
    # Requests in flight at once, seen as botocore sends them.
    seen = {"now": 0, "most": 0}

    def sending(**_):
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        time.sleep(0.02)
        seen["now"] -= 1

    fs.client.meta.events.register("before-send.s3", sending, unique_id="test-in-flight")
    got = fs.cat_ranges(paths + ["bkt/ranges/missing"], starts + [0], ends + [5])
    assert got[:-1] == expected
    assert isinstance(got[-1], FileNotFoundError)
    assert seen["most"] > 1, "the ranges' requests were in flight together"
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(["bkt/ranges/missing"], 0, 5, on_error="raise")


def test_a_large_file_written_in_parts_reads_back_byte_exact(fs, server):
    data = randbytes(13 * MIB + 4321, 6)
    before = fs.stats.as_dict()
    put_before = server.moved("http", "UploadPart")
    with fs.open("bkt/large/one.bin", "wb", block_size=5 * MIB) as f:
        for i in range(0, len(data), 777777):
            f.write(data[i : i + 777777])
    after = fs.stats.as_dict()
    # Two full parts as they filled, the rest at close: three UploadParts.
    assert after["writes"] - before["writes"] == 3
    assert after["write_bytes"] - before["write_bytes"] == len(data)
    assert server.moved("http", "UploadPart") - put_before == len(data)
    assert fs.info("bkt/large/one.bin")["size"] == len(data)
    rng = random.Random(7)
    with fs.open("bkt/large/one.bin", "rb", block_size=MIB) as f:
        assert f.size == len(data)
        for _ in range(30):
            at, n = rng.randrange(len(data)), rng.randrange(3 * MIB)
            f.seek(at)
            assert f.read(n) == data[at : at + n]
        f.seek(0)
        assert f.read() == data


def test_a_small_file_is_one_put_at_close(fs):
    before = fs.stats.writes
    with fs.open("bkt/small.bin", "wb") as f:
        for _ in range(10):
            f.write(b"0123456789" * 1000)
        assert not fs.exists("bkt/small.bin"), "nothing is stored before close"
    assert fs.stats.writes - before == 1
    assert fs.cat_file("bkt/small.bin") == b"0123456789" * 10000


def test_an_object_replaced_while_open_is_not_mixed(fs):
    fs.pipe_file("bkt/replaced.bin", randbytes(3 * MIB, 8))
    with fs.open("bkt/replaced.bin", "rb", block_size=MIB) as f:
        f.read(10)
        fs.pipe_file("bkt/replaced.bin", randbytes(3 * MIB, 9))
        f.seek(2 * MIB)
        with pytest.raises(filesystem.ObjectReplacedError, match="412"):
            f.read(10)


def test_rm_then_info_is_file_not_found_with_status_and_endpoint(fs, server):
    fs.pipe_file("bkt/gone.bin", b"bytes")
    fs.rm("bkt/gone.bin")
    with pytest.raises(FileNotFoundError) as missing:
        fs.info("bkt/gone.bin")
    assert "404" in str(missing.value) and server.endpoint in str(missing.value)
    with pytest.raises(FileNotFoundError, match="404"):
        fs.cat_file("hipobj://bkt/gone.bin")
    with pytest.raises(FileNotFoundError, match="NoSuchBucket"):
        fs.ls("nobucket/x")
    fs.pipe({"bkt/dir/x": b"1", "bkt/dir/y": b"2"})
    fs.rm("bkt/dir", recursive=True)
    assert not fs.exists("bkt/dir/x") and not fs.exists("bkt/dir")


def test_wrong_credentials_are_permission_error(options, server):
    fs = HipObjFileSystem(**dict(options, secret="not-the-secret"), skip_instance_cache=True,
                          config_kwargs={"retries": {"max_attempts": 1}})
    with pytest.raises(PermissionError) as denied:
        fs.ls("bkt")
    assert "SignatureDoesNotMatch" in str(denied.value) and "403" in str(denied.value)
    assert server.endpoint in str(denied.value)
    with pytest.raises(PermissionError):
        fs.info("bkt/small.bin")


def test_filesystems_share_botocore_s_loader_and_keep_their_own_credentials(options, monkeypatch):
    # A loader lists botocore's data directories (tens of seconds on the VM
    # lane's shared root file system): one per process, not per filesystem.
    loaders = set()
    listed = botocore.loaders.Loader.list_available_services

    def recording(self, *args, **kwargs):
        loaders.add(id(self))
        return listed(self, *args, **kwargs)

    monkeypatch.setattr(botocore.loaders.Loader, "list_available_services", recording)
    wrong = HipObjFileSystem(**dict(options, secret="not-the-secret"), skip_instance_cache=True,
                             config_kwargs={"retries": {"max_attempts": 1}})
    right = HipObjFileSystem(**options, skip_instance_cache=True)
    again = HipObjFileSystem(**options, skip_instance_cache=True)
    assert len(loaders) <= 1, f"{len(loaders)} botocore loaders for three filesystems"
    right.pipe_file("bkt/loader.bin", b"shared loader")
    assert again.cat_file("bkt/loader.bin") == b"shared loader"
    with pytest.raises(PermissionError):
        wrong.info("bkt/loader.bin")


def test_credentials_and_endpoint_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fs = fsspec.filesystem("hipobj", skip_instance_cache=True)
    assert fs.endpoint_url == server.endpoint
    fs.pipe_file("bkt/env.bin", b"from the environment")
    assert fs.cat_file("bkt/env.bin") == b"from the environment"


# ---------------------------------------------------------------- RDMA or HTTP


def test_the_fallback_is_said_once_with_its_reason(options, caplog):
    filesystem._said.clear()
    caplog.set_level(logging.WARNING, logger="hipobj.filesystem")
    first = HipObjFileSystem(**options, skip_instance_cache=True)
    second = HipObjFileSystem(**options, skip_instance_cache=True, block_size=MIB)
    for fs in (first, second):
        fs.pipe_file("bkt/said.bin", randbytes(3 * MIB, 10))
        fs.cat_ranges(["bkt/said.bin"] * 4, [0, MIB, 2 * MIB, 5], [10, 2 * MIB, None, 6])
        with fs.open("bkt/said.bin") as f:
            f.read()
    records = [r for r in caplog.records if r.name == "hipobj.filesystem"]
    assert len(records) == 1, [r.getMessage() for r in records]
    session = first.session
    assert not session.available and session.reason
    assert not first.rdma and first.http_reason == session.reason == second.http_reason
    assert session.reason in records[0].getMessage() and "plain HTTP" in records[0].getMessage()
    for fs in (first, second):
        assert fs.stats.rdma == 0 and fs.stats.http == fs.stats.reads + fs.stats.writes > 0


def test_rdma_false_uses_no_session(options):
    fs = HipObjFileSystem(**options, rdma=False, skip_instance_cache=True)
    assert fs.session is None and not fs.rdma and "rdma=False" in fs.http_reason
    fs.pipe_file("bkt/plain.bin", b"plain")
    assert fs.cat_file("bkt/plain.bin") == b"plain" and fs.stats.http == 2


# ---------------------------------------------------------------- pandas, pyarrow


def frame(rows: int = 1000) -> pandas.DataFrame:
    rng = numpy.random.default_rng(11)
    return pandas.DataFrame({
        "id": numpy.arange(rows, dtype=numpy.int64),
        "value": rng.random(rows),
        "name": [f"row-{i}" for i in range(rows)],
    })


def test_pandas_parquet_round_trip(options):
    df = frame()
    df.to_parquet("hipobj://bkt/pandas/x.parquet", storage_options=options)
    back = pandas.read_parquet("hipobj://bkt/pandas/x.parquet", storage_options=options)
    pandas.testing.assert_frame_equal(back, df)


def test_pandas_csv_round_trip(options):
    df = frame(500)
    df.to_csv("hipobj://bkt/pandas/x.csv", index=False, storage_options=options)
    back = pandas.read_csv("hipobj://bkt/pandas/x.csv", storage_options=options)
    pandas.testing.assert_frame_equal(back, df)


@pytest.fixture
def wide(options):
    """A Parquet object of three 4 MiB columns of random doubles (they do
    not compress), one row group: reading one column needs a third of it."""
    rng = numpy.random.default_rng(12)
    table = pyarrow.table({name: rng.random(MIB // 2) for name in ("a", "b", "c")})
    fs = HipObjFileSystem(**options, skip_instance_cache=True)
    pq.write_table(table, "bkt/wide.parquet", filesystem=fs, compression="none")
    return table, fs.info("bkt/wide.parquet")["size"]


def test_pyarrow_reads_one_column_by_ranges_through_fsspec(options, server, wide):
    table, size = wide
    fs = HipObjFileSystem(**options, skip_instance_cache=True, block_size=MIB)
    sent = server.moved("http")
    got = pq.read_table("bkt/wide.parquet", filesystem=fs, columns=["b"])
    assert got.column("b").equals(table.column("b"))
    read = fs.stats.read_bytes
    # The footer and column b's chunk (plus at most a read-ahead block),
    # not the whole object: the server sent that much too.
    assert size // 3 < read < size // 2, (read, size)
    assert fs.stats.reads >= 2
    assert server.moved("http") - sent == read


def test_pyarrow_reads_one_column_by_ranges_through_pyfilesystem(options, server, wide):
    table, size = wide
    fs = HipObjFileSystem(**options, skip_instance_cache=True, block_size=MIB)
    arrow_fs = PyFileSystem(FSSpecHandler(fs))
    sent = server.moved("http")
    got = pq.read_table("bkt/wide.parquet", filesystem=arrow_fs, columns=["c"])
    assert got.column("c").equals(table.column("c"))
    assert size // 3 < fs.stats.read_bytes < size // 2, (fs.stats.read_bytes, size)
    assert server.moved("http") - sent == fs.stats.read_bytes
    info = arrow_fs.get_file_info("bkt/wide.parquet")
    assert info.size == size
    # And the whole table, written and read back through pyarrow's own
    # filesystem interface.
    pq.write_table(table, "bkt/wide-copy.parquet", filesystem=arrow_fs)
    assert pq.read_table("bkt/wide-copy.parquet", filesystem=arrow_fs).equals(table)


def test_a_pipe_above_the_block_size_is_a_multipart_upload(options):
    fs = HipObjFileSystem(**options, skip_instance_cache=True, block_size=5 * MIB)
    data = randbytes(11 * MIB, 13)
    fs.pipe_file("bkt/piped.bin", data)
    assert fs.stats.writes == 3
    assert fs.cat_file("bkt/piped.bin") == data
    with io.BytesIO(data) as expected, fs.open("bkt/piped.bin", "rb") as f:
        assert f.read(MIB) == expected.read(MIB)


def test_modes_and_options_refused_with_their_reason(fs, options):
    fs.pipe_file("bkt/modes.bin", b"there")
    with pytest.raises(ValueError, match="mode 'ab'"):
        fs.open("bkt/modes.bin", "ab")
    with pytest.raises(FileExistsError, match="xb"):
        fs.open("bkt/modes.bin", "xb")
    with fs.open("bkt/modes-new.bin", "xb") as f:
        f.write(b"new")
    assert fs.cat_file("bkt/modes-new.bin") == b"new"
    with pytest.raises(IsADirectoryError, match="bucket/key"):
        fs.open("bkt", "rb")
    with pytest.raises(ValueError, match="max_concurrency"):
        HipObjFileSystem(**options, max_concurrency=0, skip_instance_cache=True)
