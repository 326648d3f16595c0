"""The PyTorch integration's rules without PyTorch (``scripts/torch-test.sh``):
``s3://`` URIs, a distributed checkpoint's object names and data-object
layout, the byte ranges a load reads (checked against NumPy's own
slicing), coalesced reads; and, against a real ``hipobj-s3-server`` (local
backend, ``HIPOBJ_S3_SERVER``, ``--no-rdma``: this host has no RDMA
device), the connector-named datasets' listing and the checkpoint
writer's and reader's byte streams. The DCP writer and reader themselves
need PyTorch: ``scripts/gpu/torch.sh`` runs them on the GPU machine."""

import random

import numpy
import pytest

import hipobj
from hipobj import _checkpoint_layout as layout
from hipobj import s3torchconnector as s3tc
from s3_server import S3Server

MIB = 1 << 20
ACCESS, SECRET = "torch-test", "torch-test-secret"


# ---------------------------------------------------------------- URIs and names


def test_s3_uris_split_into_bucket_and_key():
    assert layout.parse_s3_uri("s3://b/some/key.pt") == ("b", "some/key.pt")
    assert layout.parse_s3_uri("s3://b") == ("b", "")
    assert layout.parse_s3_uri("s3://b/") == ("b", "")
    assert layout.parse_s3_uri("s3://b/dir/") == ("b", "dir/")


@pytest.mark.parametrize(
    "uri, words",
    [
        ("b/key", "should start with s3://"),
        ("S3://b/key", "should start with s3://"),
        ("s3:///key", "names no bucket"),
        ("s3://", "names no bucket"),
        ("s3://my bucket/k", "is not a bucket name"),
        (b"s3://b/k", "is a string"),
    ],
)
def test_anything_else_is_refused_saying_what_is_wrong(uri, words):
    with pytest.raises(layout.S3UriError, match=words):
        layout.parse_s3_uri(uri)


def test_a_checkpoints_objects_are_named_as_dcps_filesystem_writer_names_its_files():
    assert layout.join_key("ckpt/step-1", layout.METADATA_NAME) == "ckpt/step-1/.metadata"
    assert layout.join_key("ckpt/step-1/", "__0_0.distcp") == "ckpt/step-1/__0_0.distcp"
    assert layout.join_key("", ".metadata") == ".metadata"
    assert layout.data_object_name(layout.rank_prefix(0)) == "__0_0.distcp"
    assert layout.data_object_name(layout.rank_prefix(17)) == "__17_0.distcp"
    with pytest.raises(ValueError):
        layout.rank_prefix(-1)


# ---------------------------------------------------------------- a rank's data object


def check_layout(sizes, straight, out, min_part=layout.MIN_PART):
    """The parts tile the object; each part's bytes are its items' at
    their offsets, and every byte of every item is in a part (its segments
    lie inside it and add up to it); every part but the last is at least
    `min_part`."""
    assert out.size == sum(sizes)
    for part in out.parts[:-1]:
        assert part.length >= min_part, part
    segments = []  # (at, length, item)
    at = 0
    for number, part in enumerate(out.parts, start=1):
        assert part.number == number and part.offset == at
        at += part.length
        if part.direct is not None:
            assert straight[part.direct]
            assert out.offsets[part.direct] + part.start == part.offset
            segments.append((part.offset, part.length, part.direct))
        else:
            assert sum(p.length for p in part.pieces) == part.length
            cursor = part.offset
            for p in part.pieces:
                assert p.at == cursor and p.length > 0
                cursor += p.length
                assert out.offsets[p.index] + p.start == p.at
                segments.append((p.at, p.length, p.index))
    assert at == out.size
    covered = [0] * len(sizes)
    for start, length, i in segments:
        assert out.offsets[i] <= start and start + length <= out.offsets[i] + sizes[i]
        covered[i] += length
    assert covered == list(sizes)


def test_large_contiguous_tensors_are_sent_straight_and_small_items_packed_after_them():
    sizes = [3 * MIB, 40 * MIB, 100, 0, 12 * MIB, 7 * MIB]
    straight = [True, True, True, True, False, True]
    out = layout.lay_out(sizes, straight, buffer_part=8 * MIB, max_part=16 * MIB)
    check_layout(sizes, straight, out)
    direct = [p for p in out.parts if p.direct is not None]
    # 40 MiB in three equal parts of at most 16 MiB, then 7 MiB whole.
    assert [(p.direct, p.length) for p in direct] == [(1, 40 * MIB // 3 + 1), (1, 40 * MIB // 3), (1, 40 * MIB // 3), (5, 7 * MIB)]
    assert out.parts[:4] == tuple(direct)
    # The rest (3 MiB, 100 B, nothing, 12 MiB not contiguous) packed in 8 MiB parts.
    packed = out.parts[4:]
    assert [p.length for p in packed] == [8 * MIB, 3 * MIB + 100 + 12 * MIB - 8 * MIB]
    assert {p.index for part in packed for p in part.pieces} == {0, 2, 4}


def test_random_layouts_keep_every_part_but_the_last_at_s3s_least():
    rng = random.Random(7)
    for _ in range(200):
        count = rng.randint(0, 12)
        sizes = [rng.choice([0, 1, 4095, MIB, 5 * MIB - 1, 5 * MIB, 9 * MIB, 33 * MIB]) for _ in range(count)]
        straight = [rng.random() < 0.7 for _ in range(count)]
        out = layout.lay_out(sizes, straight, buffer_part=6 * MIB, max_part=12 * MIB)
        check_layout(sizes, straight, out)


def test_a_layout_refuses_parts_s3_would_refuse():
    with pytest.raises(ValueError, match="buffer_part"):
        layout.lay_out([1], [True], buffer_part=MIB)
    with pytest.raises(ValueError, match="flag"):
        layout.lay_out([1, 2], [True])


# ---------------------------------------------------------------- what a load reads


def box_bytes(array, offsets, lengths):
    index = tuple(slice(o, o + n) for o, n in zip(offsets, lengths))
    return numpy.ascontiguousarray(array[index]).tobytes()


def read_ranges(blob, ranges):
    return b"".join(blob[o : o + n] for o, n in ranges)


@pytest.mark.parametrize("dtype", ["uint8", "float32", "int64"])
def test_the_ranges_of_a_sub_box_read_in_order_are_numpys_slice_of_it(dtype):
    rng = random.Random(11)
    for _ in range(300):
        rank = rng.randint(0, 4)
        shape = [rng.randint(1, 6) for _ in range(rank)]
        offsets = [rng.randint(0, n - 1) for n in shape]
        lengths = [rng.randint(1, n - o) for n, o in zip(shape, offsets)]
        array = numpy.arange(int(numpy.prod(shape)), dtype=dtype).reshape(shape)
        ranges = layout.box_ranges(shape, array.itemsize, offsets, lengths)
        assert read_ranges(array.tobytes(), ranges) == box_bytes(array, offsets, lengths), (shape, offsets, lengths)
        # Touching ranges are one.
        assert all(a[0] + a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_rows_are_one_range_and_columns_one_range_a_row():
    assert layout.box_ranges([8, 4], 4, [2, 0], [3, 4]) == [(32, 48)]
    assert layout.box_ranges([8, 4], 4, [0, 1], [3, 2]) == [(4, 8), (20, 8), (36, 8)]
    assert layout.box_ranges([8, 4], 4, [0, 0], [8, 4]) == [(0, 128)]
    assert layout.box_ranges([], 2, [], []) == [(0, 2)]
    assert layout.box_ranges([8, 0], 4, [0, 0], [8, 0]) == []
    assert layout.box_ranges([8, 4], 4, [0, 1], [3, 2], limit=2) is None
    with pytest.raises(ValueError, match="do not fit"):
        layout.box_ranges([8, 4], 4, [6, 0], [3, 4])


def test_small_reads_of_one_object_are_coalesced_within_the_gap_and_the_size():
    r = layout.Request
    requests = [
        r("a", 100, 10, "x"),
        r("a", 0, 50, "y"),
        r("a", 50, 50, "z"),   # touches y
        r("b", 0, 10, "w"),    # another object
        r("a", 120, 5, "v"),   # 10 bytes after x
        r("a", 40, 20, "u"),   # inside y and z
        r("a", 1000, 0, "e"),  # empty: no read
    ]
    reads = layout.plan_reads(requests)
    assert [(x.name, x.offset, x.length) for x in reads] == [("a", 0, 110), ("a", 120, 5), ("b", 0, 10)]
    assert {q.tag for q in reads[0].requests} == {"x", "y", "z", "u"}
    assert reads[0].range == "bytes=0-109"
    reads = layout.plan_reads(requests, gap=10)
    assert [(x.name, x.offset, x.length) for x in reads] == [("a", 0, 125), ("b", 0, 10)]
    reads = layout.plan_reads(requests, gap=10, max_bytes=100)
    assert [(x.name, x.offset, x.length) for x in reads] == [("a", 0, 100), ("a", 100, 25), ("b", 0, 10)]
    with pytest.raises(ValueError):
        layout.plan_reads([r("a", -1, 4)])


# ---------------------------------------------------------------- against the server


@pytest.fixture(scope="module")
def server():
    s = S3Server(ACCESS, SECRET, "--no-rdma")
    yield s
    s.stop()


@pytest.fixture
def client(server):
    return server.client()


@pytest.fixture
def session():
    with hipobj.Session() as s:
        yield s


def pattern(n, seed):
    return ((numpy.arange(n, dtype=numpy.uint64) * 2654435761 + seed) >> 7).astype(numpy.uint8).tobytes()


def test_a_prefix_is_listed_over_every_page_in_key_order(server, client, session):
    keys = [f"ds/train/{i:05d}.bin" for i in range(40)]
    for i, key in enumerate(keys):
        client.put_object(Bucket="bucket", Key=key, Body=pattern(i % 97 + 1, i))
    client.put_object(Bucket="bucket", Key="ds/train/", Body=b"")        # a folder marker
    client.put_object(Bucket="bucket", Key="ds/trainer.txt", Body=b"x")  # not under "ds/train/"
    dataset = s3tc.S3MapDataset.from_prefix(
        "s3://bucket/ds/train/", region="us-east-1", client=client, session=session, transform=lambda r: (r.key, r.read())
    )
    assert len(dataset) == 40
    assert [b for b, _ in dataset.objects] == ["bucket"] * 40
    assert [k for _, k in dataset.objects] == keys
    # Pages of 7: every one is read.
    assert [k for _, k in s3tc.list_prefix(client, "s3://bucket/ds/train/", page_size=7)] == keys
    assert [k for _, k in s3tc.list_prefix(client, "s3://bucket/ds/train/0003", page_size=3)] == keys[30:40]
    for i in (0, 1, 20, 39):
        key, data = dataset[i]
        assert key == keys[i] and data == pattern(i % 97 + 1, i)
    # The bytes came through the session: over plain HTTP here.
    assert session.stats.fallback == 4 and session.stats.rdma == 0


def test_an_iterable_dataset_yields_each_object_of_its_prefix_once_in_order(server, client, session):
    for i in range(5):
        client.put_object(Bucket="bucket", Key=f"it/{i}", Body=pattern(10 + i, i))
    dataset = s3tc.S3IterableDataset.from_prefix(
        "s3://bucket/it/", region="us-east-1", client=client, session=session, transform=lambda r: r.read()
    )
    assert list(dataset) == [pattern(10 + i, i) for i in range(5)]
    named = s3tc.S3MapDataset.from_objects(["s3://bucket/it/3", "s3://bucket/it/1"], client=client, session=session)
    assert [r.read() for r in (named[0], named[1])] == [pattern(13, 3), pattern(11, 1)]


def test_a_missing_prefix_bucket_says_which_and_where(server, client, session):
    dataset = s3tc.S3MapDataset.from_prefix("s3://nobucket/x/", client=client, session=session)
    with pytest.raises(hipobj.TransferError, match=r"ListObjectsV2 nobucket/x/ at http://127\.0\.0\.1:\d+: S3 error NoSuchBucket"):
        len(dataset)


def test_a_checkpoint_written_in_pieces_is_the_object_and_reads_back_with_seeks(server, client, session):
    checkpoint = s3tc.S3Checkpoint(region="us-east-1", s3client_config=s3tc.S3ClientConfig(part_size=5 * MIB),
                                   client=client, session=session)
    blob = pattern(12 * MIB + 12345, 3)
    with checkpoint.writer("s3://bucket/ckpt/model.pt") as f:
        at = 0
        for n in (1, 4095, 3 * MIB, 7 * MIB, len(blob)):
            assert f.write(memoryview(blob)[at : at + n]) == min(n, len(blob) - at)
            at = min(len(blob), at + n)
            assert f.tell() == at
    assert f.transfer.parts == 3 and f.transfer.bytes == len(blob)
    assert server.stored("ckpt/model.pt") == blob
    with checkpoint.reader("s3://bucket/ckpt/model.pt") as r:
        assert (r.bucket, r.key) == ("bucket", "ckpt/model.pt")
        assert r.read(10) == blob[:10]
        assert r.seek(-5, 2) == len(blob) - 5
        assert r.read() == blob[-5:]
        assert r.read(3) == b""
        r.seek(MIB)
        out = bytearray(2 * MIB)
        assert r.readinto(out) == 2 * MIB and out == blob[MIB : 3 * MIB]
        assert r.tell() == 3 * MIB
        r.seek(4, 1)
        assert r.read(4) == blob[3 * MIB + 4 : 3 * MIB + 8]
    assert r.transfer.path == "fallback" and r.transfer.bytes == len(blob)


def test_a_checkpoint_closed_unwritten_is_an_empty_object(server, client, session):
    checkpoint = s3tc.S3Checkpoint(client=client, session=session)
    with checkpoint.writer("s3://bucket/ckpt/empty.pt"):
        pass
    assert server.stored("ckpt/empty.pt") == b""
    assert checkpoint.reader("s3://bucket/ckpt/empty.pt").read() == b""


def test_a_checkpoint_block_that_fails_stores_nothing(server, client, session):
    checkpoint = s3tc.S3Checkpoint(client=client, session=session)
    with pytest.raises(RuntimeError, match="boom"):
        with checkpoint.writer("s3://bucket/ckpt/broken.pt") as f:
            f.write(b"half a checkpoint")
            raise RuntimeError("boom")
    with pytest.raises(client.exceptions.ClientError, match="404|Not Found|NoSuchKey"):
        client.head_object(Bucket="bucket", Key="ckpt/broken.pt")
    with pytest.raises(ValueError, match="after it was closed"):
        f.write(b"more")


def test_reading_a_missing_checkpoint_names_the_object_the_error_and_the_endpoint(server, client, session):
    checkpoint = s3tc.S3Checkpoint(client=client, session=session)
    with pytest.raises(hipobj.TransferError, match=r"HEAD bucket/ckpt/none\.pt at http://127\.0\.0\.1:\d+: S3 error (404|NoSuchKey)"):
        checkpoint.reader("s3://bucket/ckpt/none.pt").read()
    with pytest.raises(ValueError, match="names a bucket, not an object"):
        checkpoint.writer("s3://bucket/")
