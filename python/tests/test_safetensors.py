"""hipobj.safetensors on the fake libhipobj, on host memory with NumPy,
byte for byte against safetensors' own loader and writer
(``safetensors.numpy``): a file loaded by spans of RDMA GETs, a sharded
model by its index, a state dict saved by parallel multipart parts, and
files and indexes that are not what they say."""

import json
import struct

import numpy
import pytest
import safetensors.numpy

import hipobj
from hipobj import safetensors as st

MIB = 1 << 20


def state(seed=0):
    rng = numpy.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((512, 1024)).astype(numpy.float32),
        "layer.0.bias": rng.standard_normal(1000).astype(numpy.float16),
        "layer.0.index": rng.integers(-(2**40), 2**40, size=(33, 7), dtype=numpy.int64),
        "mask": rng.integers(0, 2, size=(17,)).astype(bool),
        "bytes": rng.integers(0, 255, size=(3, 5, 7), dtype=numpy.uint8),
        "empty": numpy.zeros((0, 3), dtype=numpy.float32),
        "scalar": numpy.array(3.5, dtype=numpy.float64),
        "halves": rng.integers(0, 60000, size=(999,), dtype=numpy.uint16),
    }


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_a_file_loads_by_rdma_spans_into_one_buffer_as_safetensors_loads_it(s3, session):
    tensors = state(1)
    blob = safetensors.numpy.save(tensors, metadata={"format": "np", "step": "7"})
    s3.fake.objects[("bucket", "m.safetensors")] = blob
    before = session.stats.rdma
    loaded = st.load(s3, "bucket", "m.safetensors", session=session, span=256 << 10)
    reference = safetensors.numpy.load(blob)
    assert loaded.keys() == reference.keys() == tensors.keys()
    for name in tensors:
        assert same(loaded[name], reference[name]), name
    header = st.read_header(s3, "bucket", "m.safetensors")
    assert header.metadata == {"format": "np", "step": "7"}
    spans = -(-header.data_len // (256 << 10))
    assert session.stats.rdma - before == spans, "every span by RDMA"
    assert session.stats.failed == 0
    # One buffer: every tensor is a view of it, none a copy.
    bases = {id(a.base) for a in loaded.values() if a.size}
    assert len(bases) == 1
    assert session.registered_count() <= 1 + 16, "the buffer's registration went with the load"


def test_a_long_header_is_read_in_a_second_ranged_get(s3, session):
    tensors = {f"t{i:05d}_with_a_long_name_for_the_header": numpy.full(3, i, dtype=numpy.int32) for i in range(2000)}
    blob = safetensors.numpy.save(tensors)
    assert struct.unpack("<Q", blob[:8])[0] > 64 << 10
    s3.fake.objects[("bucket", "long")] = blob
    loaded = st.load(s3, "bucket", "long", session=session)
    reference = safetensors.numpy.load(blob)
    assert all(same(loaded[n], reference[n]) for n in tensors)


def test_a_state_dict_is_saved_by_parallel_parts_and_safetensors_reads_it_back(s3, session):
    tensors = state(2)
    tensors["big"] = numpy.arange(3 * MIB, dtype=numpy.float32)  # 12 MiB
    t = st.save(s3, tensors, "bucket", "ckpt.safetensors", metadata={"step": "100"}, session=session,
                part_size=5 * MIB, jobs=3)
    assert t.path == "rdma" and t.parts == 3 and t.verified, t
    stored = s3.fake.objects[("bucket", "ckpt.safetensors")]
    back = safetensors.numpy.load(stored)
    assert back.keys() == tensors.keys()
    for name in tensors:
        assert same(back[name], tensors[name]), name
    (n,) = struct.unpack("<Q", stored[:8])
    assert n % 8 == 0 and json.loads(stored[8 : 8 + n])["__metadata__"] == {"step": "100"}
    # And ours reads what ours wrote.
    again = st.load(s3, "bucket", "ckpt.safetensors", session=session)
    assert all(same(again[k], tensors[k]) for k in tensors)
    # A small one is one PUT.
    assert st.save(s3, {"x": numpy.ones(4, dtype=numpy.int8)}, "bucket", "small", session=session).parts == 0


def test_a_span_below_one_byte_is_refused_by_both_loads_before_any_request(s3, session, fake):
    s3.fake.objects[("bucket", "m")] = safetensors.numpy.save(state(3))
    s3.fake.objects[("bucket", "i.json")] = json.dumps({"weight_map": {k: "m" for k in state(3)}}).encode()
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    for span in (0, -1):
        with pytest.raises(ValueError, match="span is a number of bytes"):
            st.load(s3, "bucket", "m", session=session, span=span)
        with pytest.raises(ValueError, match="span is a number of bytes"):
            st.load_sharded(s3, "bucket", "i.json", session=session, span=span)
    assert s3.fake.requests == [], "nothing was asked of the store"
    assert fake.hipobjFakeLiveObjects(b"mr") == mrs, "nothing stays registered"


def test_a_sharded_model_loads_through_its_index_with_every_shard_in_flight(s3, session):
    shards = [state(10 + i) for i in range(3)]
    weight_map = {}
    for i, shard in enumerate(shards):
        renamed = {f"s{i}.{k}": v for k, v in shard.items()}
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        s3.fake.objects[("bucket", f"llm/{name}")] = safetensors.numpy.save(renamed)
        weight_map.update({k: name for k in renamed})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    s3.fake.objects[("bucket", "llm/model.safetensors.index.json")] = json.dumps(index).encode()
    loaded = st.load_sharded(s3, "bucket", "llm/model.safetensors.index.json", session=session, span=MIB)
    assert loaded.keys() == weight_map.keys()
    for i, shard in enumerate(shards):
        for k, v in shard.items():
            assert same(loaded[f"s{i}.{k}"], v), (i, k)
    # An index that names a tensor its shard does not have.
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    s3.fake.objects[("bucket", "llm/bad.index.json")] = json.dumps(index).encode()
    with pytest.raises(st.FormatError, match="has no ghost"):
        st.load_sharded(s3, "bucket", "llm/bad.index.json", session=session)
    index["weight_map"]["ghost"] = "../elsewhere.safetensors"
    s3.fake.objects[("bucket", "llm/bad.index.json")] = json.dumps(index).encode()
    with pytest.raises(st.FormatError, match="not a file beside the index"):
        st.load_sharded(s3, "bucket", "llm/bad.index.json", session=session)


def raw_file(header, data=b""):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    "blob, why",
    [
        (b"\x05", "shorter than the 8 bytes"),
        (struct.pack("<Q", 10) + b"not json!!", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 1 << 40) + b"{}", "a header of"),
        (raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"x" * 8), "8 bytes for 4 items"),
        (raw_file({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"x"), "unknown dtype"),
        (raw_file({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"xy"), "object has"),
        (raw_file({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, b"xyzw"), "starts at 2"),
        (raw_file({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}), "shape"),
        (raw_file({"__metadata__": {"k": 1}}), "__metadata__"),
    ],
)
def test_an_object_that_is_not_safetensors_is_refused_before_any_rdma(s3, session, blob, why):
    s3.fake.objects[("bucket", "bad")] = blob
    before = (session.stats.rdma, session.registered_count())
    with pytest.raises(st.FormatError, match=why) as e:
        st.load(s3, "bucket", "bad", session=session)
    assert "bucket/bad" in str(e.value)
    assert (session.stats.rdma, session.registered_count()) == before


def test_a_failing_span_fails_the_load_after_every_span_ended_and_leaves_nothing_registered(s3, session, fake):
    blob = safetensors.numpy.save(state(3))
    s3.fake.objects[("bucket", "m")] = blob
    count = session.registered_count()
    s3.fake.rdma_checksum = "wrong"
    with pytest.raises(hipobj.TransferError, match="CRC"):
        st.load(s3, "bucket", "m", session=session, span=128 << 10)
    s3.fake.rdma_checksum = "right"
    assert session.registered_count() <= count + 16
    assert st.load(s3, "bucket", "m", session=session)["mask"].dtype == bool


def test_bfloat16_needs_torch_and_says_so(s3, session):
    s3.fake.objects[("bucket", "bf16")] = raw_file(
        {"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\x00\x3f\x80\x3f"
    )
    with pytest.raises(st.FormatError, match="framework='torch'"):
        st.load(s3, "bucket", "bf16", session=session)


def replace_after_first_span(s3, key, blob):
    """Stores `blob` as `key` once the first GET of `key`'s data (a ranged
    GET past its first byte) has been answered."""
    done = []

    def after(method, bucket, k, headers):
        if method == "GET" and k == key and not headers.get("range", "bytes=0-").startswith("bytes=0-") and not done:
            s3.fake.objects[(bucket, k)] = blob
            done.append(k)

    s3.fake.after = after
    return done


def gets_of(s3, key):
    return [h for (m, k, _), h in zip(s3.fake.requests, s3.fake.headers) if m == "GET" and k == key]


@pytest.mark.parametrize("honours_if_match", [True, False])
def test_a_file_replaced_during_its_load_fails_it_naming_the_object(s3, session, honours_if_match):
    blob = safetensors.numpy.save(state(4))
    resaved = safetensors.numpy.save(state(5))
    n = struct.unpack("<Q", blob[:8])[0]
    assert resaved[: 8 + n] == blob[: 8 + n] and resaved != blob, "the same header, other data"
    s3.fake.objects[("bucket", "m")] = blob
    s3.fake.ignore_if_match = not honours_if_match
    replaced = replace_after_first_span(s3, "m", resaved)
    with pytest.raises(hipobj.TransferError, match=r"bucket/m\b.*the object changed") as e:
        st.load(s3, "bucket", "m", session=session, span=128 << 10)
    assert replaced == ["m"]
    assert isinstance(e.value, hipobj.ObjectChangedError)
    assert e.value.expected == s3.fake.etag(blob)
    # Every GET after the header's asked for the header's version.
    later = gets_of(s3, "m")[1:]
    assert later and all(h.get("if-match") == s3.fake.etag(blob) for h in later), later


def test_a_long_header_replaced_between_its_two_gets_fails_the_load(s3, session):
    tensors = {f"t{i:05d}_with_a_long_name_for_the_header": numpy.full(3, i, dtype=numpy.int32) for i in range(2000)}
    blob = safetensors.numpy.save(tensors)
    s3.fake.objects[("bucket", "long")] = blob
    resaved = safetensors.numpy.save({k: v + 1 for k, v in tensors.items()})

    def after(method, bucket, key, headers):
        if key == "long" and headers.get("range") == "bytes=0-65535":
            s3.fake.objects[(bucket, key)] = resaved

    s3.fake.after = after
    with pytest.raises(hipobj.ObjectChangedError, match=r"bucket/long\b.*the object changed"):
        st.load(s3, "bucket", "long", session=session)
    assert gets_of(s3, "long")[1].get("if-match") == s3.fake.etag(blob)


def test_a_shard_replaced_during_a_sharded_load_fails_it_naming_the_shard(s3, session):
    weight_map = {}
    for i in range(2):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        s3.fake.objects[("bucket", f"llm/{name}")] = safetensors.numpy.save({f"s{i}.{k}": v for k, v in state(20 + i).items()})
        weight_map.update({f"s{i}.{k}": name for k in state(20 + i)})
    index = {"metadata": {}, "weight_map": weight_map}
    s3.fake.objects[("bucket", "llm/index.json")] = json.dumps(index).encode()
    second = "llm/model-00002-of-00002.safetensors"
    first_blob = s3.fake.objects[("bucket", "llm/model-00001-of-00002.safetensors")]
    second_blob = s3.fake.objects[("bucket", second)]
    replace_after_first_span(s3, second, safetensors.numpy.save({f"s1.{k}": v for k, v in state(99).items()}))
    with pytest.raises(hipobj.ObjectChangedError, match="bucket/llm/model-00002-of-00002.safetensors.*the object changed"):
        st.load_sharded(s3, "bucket", "llm/index.json", session=session, span=256 << 10)
    # Each shard pinned to its own version.
    for key, blob in [("llm/model-00001-of-00002.safetensors", first_blob), (second, second_blob)]:
        later = gets_of(s3, key)[1:]
        assert later and all(h.get("if-match") == s3.fake.etag(blob) for h in later), key
