"""The package on the fake libhipobj, through a real boto3 client (its
signing and events) whose S3 answers from tests/fake_s3.py: RDMA paths,
the fallback, strictness, GPU memory, buffers of every kind, failures."""

import asyncio
import base64
import ctypes
import gc
import multiprocessing
import pathlib
import threading
import time
import traceback
import weakref

import numpy
import pytest
from botocore.exceptions import ClientError

import hipobj

MIB = 1 << 20
SYSFS = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sysfs"


def pattern(n, seed):
    return (numpy.arange(n, dtype=numpy.uint64) * 2654435761 + seed).astype(numpy.uint8)


def put(s3, key, data):
    s3.fake.objects[("bucket", key)] = bytes(data)


class FakeCudaArray:
    """GPU memory of the fake library's fake GPU, as a CUDA array."""

    def __init__(self, lib, n):
        self.lib = lib
        self.n = n
        self.ptr = lib.hipobjFakeDeviceAlloc(n)
        assert self.ptr
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
        }

    def read(self):
        out = ctypes.create_string_buffer(self.n)
        assert self.lib.hipobjFakeDeviceRead(out, self.ptr, self.n) == 0
        return out.raw

    def write(self, data):
        assert self.lib.hipobjFakeDeviceWrite(self.ptr, data, len(data)) == 0


def fake_copier(lib):
    def to_device(dst, src, n):
        assert lib.hipobjFakeDeviceWrite(dst, src, n) == 0

    def to_host(dst, src, n):
        assert lib.hipobjFakeDeviceRead(dst, src, n) == 0

    return to_device, to_host


def test_a_get_and_a_put_of_numpy_arrays_go_by_rdma_byte_exact(s3, session):
    data = pattern(3 * MIB + 5, 1)
    put(s3, "k", data)
    into = numpy.zeros(data.size, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert (t.path, t.bytes, t.reason) == ("rdma", data.size, None)
    assert numpy.array_equal(into, data)
    source = pattern(2 * MIB, 9)
    t = session.put_object(s3, Bucket="bucket", Key="up", source=source)
    assert t.path == "rdma"
    assert s3.fake.objects[("bucket", "up")] == source.tobytes()
    assert session.stats.rdma == 2 and session.stats.rdma_bytes == data.size + source.size
    # Every request carried a token, signed with the rest.
    assert all(token for _, _, token in s3.fake.requests)


def test_the_token_is_signed_by_sigv4(s3, session):
    seen = {}

    def grab(request, **_):
        seen["auth"] = request.headers.get("Authorization")

    s3.meta.events.register("before-send.s3", grab, unique_id="grab-auth")
    put(s3, "k", pattern(4096, 2))
    session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(4096))
    auth = seen["auth"].decode() if isinstance(seen["auth"], bytes) else seen["auth"]
    assert "x-amz-rdma-token" in auth.split("SignedHeaders=")[1].split(",")[0]


def test_a_loop_of_gets_into_one_array_registers_it_once(s3, session, fake):
    put(s3, "k", pattern(MIB, 3))
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    session.get_object(s3, Bucket="bucket", Key="k", into=into)
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    for _ in range(5):
        session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert fake.hipobjFakeLiveObjects(b"mr") == mrs
    assert session.registered_count() == 1
    assert session.release(into) and not session.release(into)
    assert session.registered_count() == 0
    with session.registered(into):
        assert session.registered_count() == 1
    assert session.registered_count() == 0


def test_ranges_and_offsets_land_where_asked(s3, session):
    data = pattern(MIB, 4)
    put(s3, "k", data)
    into = bytearray(2000)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into, Range="bytes=1000-1999", offset=1000)
    assert t.bytes == 1000
    assert into[:1000] == bytes(1000) and bytes(into[1000:]) == data[1000:2000].tobytes()
    with pytest.raises(ValueError):
        session.get_object(s3, Bucket="bucket", Key="k", into=into, Range="bytes=0-1999", offset=1)
    with pytest.raises(ValueError):
        session.get_object(s3, Bucket="bucket", Key="k", into=into, Range="lines=1-2")


def test_a_declined_transfer_falls_back_to_plain_http_unless_strict(s3, session, fake):
    data = pattern(MIB, 5)
    put(s3, "k", data)
    assert fake.hipobjFakeSetServerBehaviour(1) == 0
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert t.path == "fallback" and "x-amz-rdma-reply 501" in t.reason
    assert numpy.array_equal(into, data)
    source = pattern(MIB, 6)
    t = session.put_object(s3, Bucket="bucket", Key="up", source=source)
    assert t.path == "fallback"
    assert s3.fake.objects[("bucket", "up")] == source.tobytes()
    into[:] = 0
    with pytest.raises(hipobj.TransferError, match="strict"):
        session.get_object(s3, Bucket="bucket", Key="k", into=into, strict=True)
    assert not into.any(), "a strict refusal writes nothing"
    with pytest.raises(hipobj.TransferError, match="strict"):
        session.put_object(s3, Bucket="bucket", Key="strict", source=source, strict=True)
    assert ("bucket", "strict") not in s3.fake.objects
    assert (session.stats.fallback, session.stats.fallback_bytes) == (2, 2 * MIB)


def test_a_server_that_ignores_the_token_is_a_decline(s3, session):
    data = pattern(8192, 7)
    put(s3, "k", data)
    s3.fake.ignore_tokens = True
    into = bytearray(8192)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert t.path == "fallback" and bytes(into) == data.tobytes()


def test_a_large_upload_is_multipart_each_part_by_rdma(s3, session, fake):
    data = pattern(12 * MIB + 3, 8)
    t = session.upload(s3, Bucket="bucket", Key="big", source=data, part_size=5 * MIB)
    assert (t.path, t.parts, t.bytes) == ("rdma", 3, data.size)
    assert s3.fake.objects[("bucket", "big")] == data.tobytes()
    assert fake.hipobjFakeSetServerBehaviour(1) == 0
    t = session.upload(s3, Bucket="bucket", Key="big2", source=data, part_size=5 * MIB)
    assert (t.path, t.parts) == ("fallback", 3)
    assert s3.fake.objects[("bucket", "big2")] == data.tobytes()
    with pytest.raises(ValueError):
        session.upload(s3, Bucket="bucket", Key="x", source=data, part_size=MIB)


def test_a_failed_part_aborts_the_upload(s3, session, fake):
    data = pattern(11 * MIB, 9)
    assert fake.hipobjFakeSetServerBehaviour(4) == 0
    with pytest.raises(hipobj.TransferError):
        session.upload(s3, Bucket="bucket", Key="big", source=data, part_size=5 * MIB)
    assert ("bucket", "big") not in s3.fake.objects
    assert s3.fake.parts == {}, "the upload was aborted"


def test_gpu_memory_is_reached_by_rdma_and_by_the_fallback_through_the_runtime(s3, session, fake):
    data = pattern(2 * MIB, 10)
    put(s3, "k", data)
    gpu = FakeCudaArray(fake, 2 * MIB)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=gpu)
    assert t.path == "rdma" and gpu.read() == data.tobytes()
    gpu.write(pattern(2 * MIB, 11).tobytes())
    session.put_object(s3, Bucket="bucket", Key="up", source=gpu)
    assert s3.fake.objects[("bucket", "up")] == pattern(2 * MIB, 11).tobytes()
    # The fallback reaches GPU memory through the runtime's copies (here
    # the fake GPU's).
    hipobj.set_copier(*fake_copier(fake))
    assert fake.hipobjFakeSetServerBehaviour(1) == 0
    put(s3, "k2", pattern(2 * MIB, 12))
    t = session.get_object(s3, Bucket="bucket", Key="k2", into=gpu)
    assert t.path == "fallback" and gpu.read() == pattern(2 * MIB, 12).tobytes()
    session.close()
    assert fake.hipobjFakeDeviceFree(gpu.ptr) == 0


def test_dlpack_tensors_and_memoryviews_are_buffers_too(s3, session):
    class Tensor:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kw):
            return self.array.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    data = pattern(MIB, 13)
    put(s3, "k", data)
    array = numpy.zeros(MIB // 4, dtype=numpy.float32)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=Tensor(array))
    assert t.path == "rdma" and array.tobytes() == data.tobytes()
    raw = bytearray(MIB)
    session.get_object(s3, Bucket="bucket", Key="k", into=memoryview(raw))
    assert bytes(raw) == data.tobytes()
    # A read-only source is copied, not refused.
    session.put_object(s3, Bucket="bucket", Key="ro", source=bytes(data.tobytes()))
    assert s3.fake.objects[("bucket", "ro")] == data.tobytes()


def test_memory_a_transfer_cannot_use_is_refused_clearly(s3, session):
    put(s3, "k", pattern(4096, 14))
    with pytest.raises(hipobj.UnusableBufferError, match="not C-contiguous"):
        session.get_object(s3, Bucket="bucket", Key="k", into=numpy.zeros((64, 128), numpy.uint8)[:, ::2])
    with pytest.raises(hipobj.UnusableBufferError, match="read-only"):
        session.get_object(s3, Bucket="bucket", Key="k", into=b"\0" * 4096)
    with pytest.raises(hipobj.UnusableBufferError, match="not a buffer"):
        session.get_object(s3, Bucket="bucket", Key="k", into=object())
    assert s3.fake.requests == [], "nothing was sent"


def test_a_refused_buffer_is_reported_under_its_public_name(s3, session):
    with pytest.raises(hipobj.UnusableBufferError) as e:
        session.get_object(s3, Bucket="bucket", Key="k", into=b"\0" * 4096)
    shown = "".join(traceback.format_exception_only(e.type, e.value))
    assert shown == "hipobj.UnusableBufferError: the buffer is read-only: a GET writes into it\n"
    odd = {"shape": (4,), "typestr": "<f", "data": (4096, False), "version": 3}
    with pytest.raises(hipobj.UnusableBufferError, match="item size"):
        session.get_object(s3, Bucket="bucket", Key="k", into=type("A", (), {"__cuda_array_interface__": odd})())
    # The name it was exported under before, and what it still is.
    assert hipobj.BufferError is hipobj.UnusableBufferError
    assert issubclass(hipobj.UnusableBufferError, TypeError)


def test_s3_errors_and_short_objects_are_errors_with_their_cause(s3, session):
    into = bytearray(4096)
    with pytest.raises(hipobj.TransferError) as e:
        session.get_object(s3, Bucket="bucket", Key="missing", into=into)
    assert isinstance(e.value.cause, ClientError)
    assert e.value.cause.response["Error"]["Code"] == "NoSuchKey"
    put(s3, "short", pattern(100, 1))
    with pytest.raises(hipobj.TransferError, match="shorter"):
        session.get_object(s3, Bucket="bucket", Key="short", into=into)


def test_s3_failures_are_one_transfer_error_on_the_rdma_and_the_plain_path(s3, fake):
    def failure(call):
        with pytest.raises(hipobj.TransferError) as e:
            call()
        assert isinstance(e.value.cause, ClientError)
        return e.value

    into = bytearray(4096)
    # A session without RDMA (the NIC it names is not there): plain HTTP.
    with hipobj.Session(nic="mlx5_9") as plain:
        assert not plain.available
        missing = failure(lambda: plain.get_object(s3, Bucket="bucket", Key="missing", into=into))
        s3.fake.refuse_plain = (403, "SignatureDoesNotMatch")
        denied = failure(lambda: plain.put_object(s3, Bucket="bucket", Key="k", source=into))
        parts = failure(lambda: plain.upload(s3, Bucket="bucket", Key="big", source=bytearray(11 * MIB), part_size=5 * MIB))
        s3.fake.refuse_plain = None
    assert str(missing) == "GET bucket/missing at http://s3.test:9000: S3 error NoSuchKey (HTTP 404): no such key"
    assert (missing.s3_code, missing.http_status) == ("NoSuchKey", 404)
    assert str(denied) == (
        "PUT bucket/k at http://s3.test:9000: S3 error SignatureDoesNotMatch (HTTP 403): refused by the test"
    )
    assert "CreateMultipartUpload bucket/big at http://s3.test:9000: S3 error SignatureDoesNotMatch" in str(parts)
    with hipobj.Session(gpu=0) as session:
        # By RDMA: the same error, in the same words.
        rdma = failure(lambda: session.get_object(s3, Bucket="bucket", Key="missing", into=into))
        assert str(rdma) == str(missing)
        # Declined, then refused over plain HTTP.
        assert fake.hipobjFakeSetServerBehaviour(1) == 0
        s3.fake.refuse_plain = (403, "SignatureDoesNotMatch")
        assert str(failure(lambda: session.put_object(s3, Bucket="bucket", Key="k", source=into))) == str(denied)


def test_a_server_without_its_final_message_fails_the_transfer_and_the_next_works(s3, session, fake):
    data = pattern(MIB, 15)
    put(s3, "k", data)
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    assert fake.hipobjFakeSetServerBehaviour(2) == 0
    with pytest.raises(hipobj.TransferError, match="hipObjRdmaError"):
        session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert fake.hipobjFakeSetServerBehaviour(0) == 0
    assert session.get_object(s3, Bucket="bucket", Key="k", into=into).path == "rdma"
    assert numpy.array_equal(into, data)


def test_a_failed_registration_falls_back_and_says_why_unless_strict(s3, session, fake):
    data = pattern(4096, 16)
    put(s3, "k", data)
    assert fake.hipobjFakeFailCall(b"ibv_reg_mr", 1) == 0
    into = bytearray(4096)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert t.path == "fallback" and bytes(into) == data.tobytes()
    assert "registering the buffer failed" in t.reason and "hipObjRdmaError" in t.reason
    assert fake.hipobjFakeFailCall(b"ibv_reg_mr", 1) == 0
    with pytest.raises(hipobj.TransferError, match="hipObjRdmaError.*strict") as e:
        session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(4096), strict=True)
    assert isinstance(e.value.cause, hipobj.HipObjError)
    # The application registered the same memory itself.
    array = numpy.zeros(4096, numpy.uint8)
    assert fake.hipObjBufRegisterHost(array.ctypes.data, 4096).opError == 0
    t = session.get_object(s3, Bucket="bucket", Key="k", into=array)
    assert t.path == "fallback" and "hipObjBufAlreadyRegistered" in t.reason
    assert numpy.array_equal(array, data)
    assert fake.hipObjBufDeregister(array.ctypes.data).opError == 0
    assert session.registered_count() == 0
    assert session.get_object(s3, Bucket="bucket", Key="k", into=array).path == "rdma"
    # The bounce buffer of read-only sources, likewise.
    assert fake.hipobjFakeFailCall(b"ibv_reg_mr", 1) == 0
    t = session.put_object(s3, Bucket="bucket", Key="ro", source=data.tobytes())
    assert t.path == "fallback" and "registering the bounce buffer failed" in t.reason
    assert s3.fake.objects[("bucket", "ro")] == data.tobytes()
    assert session.put_object(s3, Bucket="bucket", Key="ro", source=data.tobytes()).path == "rdma"


def test_hundreds_of_distinct_buffers_all_go_by_rdma_and_few_stay_registered(s3, session, fake):
    data = pattern(4096, 17)
    put(s3, "k", data)
    session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(4096))
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    kept = []
    for i in range(420):
        # Every one kept alive: the session lets go of them itself.
        into = numpy.zeros(4096, numpy.uint8) if i % 3 else bytearray(4096)
        kept.append(into)
        t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
        assert t.path == "rdma", (i, t)
        assert session.registered_count() <= session.registration_cache == 16
    assert fake.hipobjFakeLiveObjects(b"mr") <= mrs + 16
    assert all(bytes(b) == data.tobytes() for b in kept)
    for i in range(3):
        assert session.put_object(s3, Bucket="bucket", Key=f"up{i}", source=kept[i]).path == "rdma"


def test_read_only_sources_go_through_one_registered_bounce_buffer(s3, session, fake):
    for i in range(300):
        source = pattern(4096 + i, i).tobytes()
        t = session.put_object(s3, Bucket="bucket", Key=f"ro{i}", source=source)
        assert t.path == "rdma", (i, t)
        assert s3.fake.objects[("bucket", f"ro{i}")] == source
    assert session.registered_count() == 1, "the bounce buffer alone"
    # It grows for a larger source, a read-only memoryview too, and stays one.
    big = pattern(3 * MIB, 18)
    big.flags.writeable = False
    t = session.upload(s3, Bucket="bucket", Key="big", source=memoryview(big))
    assert t.path == "rdma" and s3.fake.objects[("bucket", "big")] == big.tobytes()
    assert session.registered_count() == 1
    # Nothing to release: it was never the source's own registration.
    assert not session.release(big.tobytes())
    with pytest.raises(hipobj.UnusableBufferError, match="read-only"):
        session.register(b"\0" * 4096)
    assert session.registered_count() == 1


def test_a_read_only_source_beyond_the_bounce_buffer_s_bound_falls_back(s3, fake):
    source = pattern(2 * MIB, 19).tobytes()
    with hipobj.Session(gpu=0, bounce_limit=MIB) as s:
        t = s.put_object(s3, Bucket="bucket", Key="k", source=source)
        assert t.path == "fallback" and "bounce_limit" in t.reason
        assert s3.fake.objects[("bucket", "k")] == source
        with pytest.raises(hipobj.TransferError, match="bounce_limit.*strict"):
            s.put_object(s3, Bucket="bucket", Key="strict", source=source, strict=True)
        assert s.put_object(s3, Bucket="bucket", Key="small", source=source[:MIB]).path == "rdma"


def test_an_explicit_registration_stays_until_released(s3, session, fake):
    data = pattern(MIB, 20)
    put(s3, "k", data)
    array = numpy.zeros(MIB, numpy.uint8)
    session.register(array)
    assert session.get_object(s3, Bucket="bucket", Key="k", into=array).path == "rdma"
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    for _ in range(3):
        assert session.get_object(s3, Bucket="bucket", Key="k", into=array).path == "rdma"
    # A part of it is reached through the same registration.
    part = array[4096:8192]
    t = session.get_object(s3, Bucket="bucket", Key="k", into=part, Range="bytes=0-4095")
    assert t.path == "rdma" and numpy.array_equal(part, data[:4096])
    assert fake.hipobjFakeLiveObjects(b"mr") == mrs and session.registered_count() == 1
    # Kept alive while registered, let go once released.
    ref = weakref.ref(array)
    del array, part
    gc.collect()
    assert ref() is not None
    assert session.release(ref()) and not session.release(ref())
    assert session.registered_count() == 0
    gc.collect()
    assert ref() is None


def test_memory_that_moved_under_its_object_is_not_reached_through_its_old_registration(s3, session, fake):
    # An array resized in place gets new memory; a new object may then get
    # the old address, which the old registration still names (with the
    # old pages, where the memory was unmapped in between).
    put(s3, "k", pattern(MIB, 22))
    moved = FakeCudaArray(fake, MIB)
    old = moved.ptr
    assert session.get_object(s3, Bucket="bucket", Key="k", into=moved).path == "rdma"
    elsewhere = FakeCudaArray(fake, MIB)
    moved.__cuda_array_interface__ = dict(moved.__cuda_array_interface__, data=(elsewhere.ptr, False))
    newcomer = FakeCudaArray(fake, MIB)
    spare, newcomer.ptr = newcomer.ptr, old
    newcomer.__cuda_array_interface__ = dict(newcomer.__cuda_array_interface__, data=(old, False))
    assert session.get_object(s3, Bucket="bucket", Key="k", into=newcomer).path == "rdma"
    # The newcomer's own registration, which goes with it.
    del newcomer
    gc.collect()
    assert session.registered_count() == 0
    session.close()
    for ptr in (old, elsewhere.ptr, spare):
        assert fake.hipobjFakeDeviceFree(ptr) == 0


def test_a_buffer_passed_to_a_transfer_is_not_kept_alive(s3, session, fake):
    put(s3, "k", pattern(MIB, 21))
    session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(MIB))
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    array = numpy.zeros(MIB, numpy.uint8)
    gpu = FakeCudaArray(fake, MIB)
    ptr = gpu.ptr
    assert session.get_object(s3, Bucket="bucket", Key="k", into=array).path == "rdma"
    assert session.get_object(s3, Bucket="bucket", Key="k", into=gpu).path == "rdma"
    refs = [weakref.ref(array), weakref.ref(gpu)]
    del array, gpu
    gc.collect()
    assert all(r() is None for r in refs)
    assert session.registered_count() == 0
    assert fake.hipobjFakeLiveObjects(b"mr") <= mrs
    assert fake.hipobjFakeDeviceFree(ptr) == 0


def test_one_session_at_a_time_and_closing_releases_everything(fake):
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    with hipobj.Session(gpu=0) as s:
        with pytest.raises(hipobj.HipObjError, match="hipObjAlreadyInitialized"):
            hipobj.Session(gpu=0)
        s.register(numpy.zeros(MIB, numpy.uint8))
        s.register(bytearray(4096))
        assert s.registered_count() == 2
    assert fake.hipobjFakeLiveObjects(b"mr") == mrs
    assert hipobj.version() == "0.1.0"


def test_transfers_on_many_threads_each_land_their_own_bytes(s3, session):
    for i in range(8):
        put(s3, f"k{i}", pattern(MIB, 20 + i))
    results = {}

    def work(i):
        into = numpy.zeros(MIB, dtype=numpy.uint8)
        for _ in range(3):
            session.get_object(s3, Bucket="bucket", Key=f"k{i}", into=into)
        results[i] = numpy.array_equal(into, pattern(MIB, 20 + i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: True for i in range(8)}
    assert session.stats.rdma == 24


def test_a_client_whose_first_transfers_start_together_signs_one_token_each(s3, session, monkeypatch):
    # botocore registers an event handler by checking its unique id, then
    # adding it, with nothing held in between: the transfers that start a
    # new client's first requests together must not each install the
    # package's hooks (before _add_token replaced the header, a second one
    # appended a second token, and every request of that client was
    # refused: SignatureDoesNotMatch). The window is widened here to where
    # all 16 transfers meet in it.
    trie = s3.meta.events._emitter._handlers
    append = trie.append_item

    def slow_append(*args, **kwargs):
        time.sleep(0.2)
        return append(*args, **kwargs)

    monkeypatch.setattr(trie, "append_item", slow_append)
    from hipobj import _session

    signed = []
    add_token = _session._add_token

    def counted_add_token(request, **kwargs):
        signed.append(request)
        add_token(request, **kwargs)

    monkeypatch.setattr(_session, "_add_token", counted_add_token)
    datas = [pattern(4096 + i, 60 + i) for i in range(16)]
    puts = session.put_objects(s3, [dict(Bucket="bucket", Key=f"t{i}", source=d) for i, d in enumerate(datas)])
    assert [t.path for t in puts] == ["rdma"] * 16
    assert all(s3.fake.objects[("bucket", f"t{i}")] == d.tobytes() for i, d in enumerate(datas))
    # The hook ran once a request: it was installed once.
    assert len(signed) == 16


def test_a_hook_installed_twice_still_sends_one_token(s3, session):
    # However often botocore runs _add_token on a request (a hook another
    # library registered again, under another id), the request carries
    # one x-amz-rdma-token.
    from hipobj import _session

    s3.meta.events.register("before-sign.s3", _session._add_token, unique_id="another-copy")
    put(s3, "k", pattern(MIB, 61))
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    assert session.get_object(s3, Bucket="bucket", Key="k", into=into).path == "rdma"
    assert numpy.array_equal(into, pattern(MIB, 61))
    source = pattern(MIB, 62)
    assert session.put_object(s3, Bucket="bucket", Key="up", source=source).path == "rdma"
    assert s3.fake.objects[("bucket", "up")] == source.tobytes()


def test_the_module_s_functions_use_the_open_session(s3, session):
    data = pattern(MIB, 30)
    put(s3, "k", data)
    assert hipobj.active() is session
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    t = hipobj.get_object(s3, Bucket="bucket", Key="k", into=into, Range=f"bytes=0-{MIB - 1}")
    assert t.path == "rdma" and numpy.array_equal(into, data)
    assert hipobj.put_object(s3, Bucket="bucket", Key="m", source=into).path == "rdma"
    assert s3.fake.objects[("bucket", "m")] == data.tobytes()
    assert session.stats.rdma == 2


def test_without_the_library_a_session_falls_back_and_says_where_it_looked(s3, monkeypatch, tmp_path):
    missing = tmp_path / "libhipobj.so.0"
    monkeypatch.setattr(hipobj._lib, "_loaded", None)
    monkeypatch.setenv("HIPOBJ_LIBRARY", str(missing))
    data = pattern(8192, 40)
    put(s3, "k", data)
    with hipobj.Session() as s:
        assert not s.available
        assert str(missing) in s.reason and "HIPOBJ_LIBRARY" in s.reason
        into = bytearray(8192)
        t = s.get_object(s3, Bucket="bucket", Key="k", into=into)
        assert t.path == "fallback" and bytes(into) == data.tobytes()
        assert str(missing) in t.reason
        with pytest.raises(hipobj.TransferError, match="strict"):
            s.put_object(s3, Bucket="bucket", Key="strict", source=into, strict=True)
    assert hipobj.library_version() is None
    with pytest.raises(ImportError, match="HIPOBJ_LIBRARY"):
        hipobj.Session(require=True)


def test_the_library_is_searched_in_the_checkout_only_from_a_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("HIPOBJ_LIBRARY")
    # This package is installed: the loader's search only.
    assert hipobj._lib._candidates() == [hipobj._lib.SONAME]
    repo = tmp_path / "repo"
    (repo / "python" / "hipobj").mkdir(parents=True)
    (repo / "Cargo.toml").write_text("")
    (repo / "python" / "pyproject.toml").write_text("")
    assert hipobj._lib._candidates(repo / "python" / "hipobj") == [
        hipobj._lib.SONAME,
        str(repo / "target" / "release" / "libhipobj.so"),
    ]
    monkeypatch.setenv("HIPOBJ_LIBRARY", "/opt/x/libhipobj.so")
    assert hipobj._lib._candidates() == ["/opt/x/libhipobj.so"]


def sysfs(root, **ports):
    """A sysfs tree under `root` with RDMA devices NAME=[port states]."""
    for name, states in ports.items():
        for number, state in enumerate(states, start=1):
            port = root / "sys" / "class" / "infiniband" / name / "ports" / str(number)
            port.mkdir(parents=True)
            (port / "state").write_text(state + "\n")
    return str(root)


class WithoutGpu:
    """The library on a host with no GPU: hipObjInit without a NIC hint
    fails as the C ABI says (hipObjRdmaError, hipError 100); with one it
    runs (on the fake world, whose NIC is client0). Records each init's
    NIC hint."""

    def __init__(self, lib):
        self.lib = lib
        self.hints = []

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def hipObjInit(self, config):
        hint = config._obj.nicHint
        self.hints.append(hint)
        if hint is None:
            return hipobj._lib.ErrorT(4, 100)
        return self.lib.hipObjInit(config)


def test_the_nics_a_session_without_a_gpu_may_use_are_those_with_an_active_port(tmp_path):
    active = hipobj._nics.active_devices
    assert active(str(SYSFS / "softroce")) == ["rxe0"]
    assert active(str(SYSFS / "port-down")) == ["mlx4_0"]  # port 2 is
    assert active(str(SYSFS / "two-sockets")) == ["bnxt_re0", "bnxt_re1"]
    assert active(str(SYSFS / "switch")) == ["bnxt_re0", "ionic_0"]
    # Malformed states and port numbers the kernel never makes are not.
    assert active(str(SYSFS / "garbage")) == ["bad0"]
    assert active(sysfs(tmp_path / "down", mlx5_0=["1: DOWN", "2: INIT"])) == []
    assert active(str(tmp_path / "nothing")) == []


def test_a_session_not_asked_for_a_gpu_serves_host_memory_on_the_active_nics(s3, fake, monkeypatch, tmp_path):
    monkeypatch.delenv("HIPOBJ_NIC_HINT", raising=False)
    lib = WithoutGpu(hipobj.library())
    monkeypatch.setattr(hipobj._lib, "library", lambda: lib)
    root = sysfs(tmp_path, client0=["4: ACTIVE"], down0=["1: DOWN"])
    data = pattern(MIB, 60)
    put(s3, "k", data)
    with hipobj.Session(sysfs_root=root) as s:
        assert s.available, s.reason
        assert lib.hints == [None, b"client0"] and s.nic == "client0"
        into = numpy.zeros(MIB, numpy.uint8)
        assert s.get_object(s3, Bucket="bucket", Key="k", into=into).path == "rdma"
        assert numpy.array_equal(into, data)


def test_without_a_gpu_or_an_active_nic_the_reason_says_so(fake, monkeypatch, tmp_path):
    monkeypatch.delenv("HIPOBJ_NIC_HINT", raising=False)
    lib = WithoutGpu(hipobj.library())
    monkeypatch.setattr(hipobj._lib, "library", lambda: lib)
    root = sysfs(tmp_path, down0=["1: DOWN"])
    with hipobj.Session(sysfs_root=root) as s:
        assert not s.available
        assert "no RDMA device with an active port" in s.reason
        assert "pass nic= or set HIPOBJ_NIC_HINT" in s.reason
    with pytest.raises(hipobj.HipObjError, match="no RDMA device with an active port"):
        hipobj.Session(sysfs_root=root, require=True)
    # A NIC named that has no active port.
    with hipobj.Session(nic="mlx5_9", sysfs_root=root) as s:
        assert not s.available
        assert "mlx5_9 is not among the RDMA devices with an active port (those: none)" in s.reason
    # A GPU asked for is not dropped for host memory.
    lib.hints.clear()
    with hipobj.Session(gpu=0, sysfs_root=sysfs(tmp_path / "up", client0=["4: ACTIVE"])) as s:
        assert not s.available and lib.hints == [None]
        assert "no GPU" in s.reason and "gpu=0" in s.reason


SPIED = (
    "hipObjInit",
    "hipObjShutdown",
    "hipObjBufRegister",
    "hipObjBufRegisterHost",
    "hipObjBufDeregister",
    "hipObjGet",
    "hipObjPut",
)


def in_forked_child(session, s3, data, kept):
    """In a child forked from the test: a GET and a PUT of bytes on the
    parent's session, a release of the parent's registration of `kept`,
    then close; every library call made, with its first argument and
    result."""
    calls = []
    lib = session._lib
    for name in SPIED:
        real = getattr(lib, name)

        def spy(*args, _name=name, _real=real):
            err = _real(*args)
            first = args[0] if args and isinstance(args[0], int) else None
            calls.append((_name, first, err.opError))
            return err

        setattr(lib, name, spy)
    into = numpy.zeros(data.size, numpy.uint8)
    got = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    sent = session.put_object(s3, Bucket="bucket", Key="from-child", source=data.tobytes())
    released = session.release(kept)
    session.close()
    return {
        "calls": calls,
        "paths": (got.path, sent.path),
        "reasons": (got.reason, sent.reason),
        "same": numpy.array_equal(into, data),
        "stored": s3.fake.objects.get(("bucket", "from-child")) == data.tobytes(),
        "released": released,
    }


def test_a_forked_child_never_calls_into_the_parent_s_instance(s3, session, fake):
    data = pattern(MIB, 70)
    put(s3, "k", data)
    kept = numpy.zeros(MIB, numpy.uint8)
    session.register(kept)
    cached = numpy.zeros(MIB, numpy.uint8)
    assert session.get_object(s3, Bucket="bucket", Key="k", into=cached).path == "rdma"
    assert session.put_object(s3, Bucket="bucket", Key="b", source=data.tobytes()).path == "rdma"
    count, mrs = session.registered_count(), fake.hipobjFakeLiveObjects(b"mr")
    parent = {kept.ctypes.data, cached.ctypes.data} | {
        e.ptr for e in session._registry.entries.values()
    }
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child():
        try:
            send.send(in_forked_child(session, s3, data, kept))
        except BaseException as e:  # the parent reports it
            send.send({"error": f"{type(e).__name__}: {e}"})

    process = context.Process(target=child)
    process.start()
    # A generous bound: only a hang exceeds it.
    assert receive.poll(120), "the child hung"
    result = receive.recv()
    process.join(120)
    assert process.exitcode == 0
    assert "error" not in result, result["error"]
    calls = result["calls"]
    # Nothing before the child's own hipObjInit; nothing at all after one
    # that failed (this library keeps the parent's instance in a child).
    if calls:
        assert calls[0][0] == "hipObjInit", calls
    if calls and calls[0][2] != 0:
        assert len(calls) == 1, calls
        assert result["paths"] == ("fallback", "fallback")
        assert all("fork" in reason for reason in result["reasons"]), result["reasons"]
    # Never the parent's registrations: an address the parent registered is
    # deregistered in the child only after the child's own instance
    # registered it (the child's copy of that memory).
    registered_here = set()
    for name, ptr, _ in calls:
        if name in ("hipObjBufRegister", "hipObjBufRegisterHost"):
            registered_here.add(ptr)
        elif name == "hipObjBufDeregister":
            assert ptr not in parent or ptr in registered_here, calls
    assert result["same"] and result["stored"] and not result["released"]
    # The parent's session is as it was.
    assert session.registered_count() == count and fake.hipobjFakeLiveObjects(b"mr") == mrs
    assert session.get_object(s3, Bucket="bucket", Key="k", into=kept).path == "rdma"
    assert numpy.array_equal(kept, data)


class ForkAwareLibrary:
    """A library that forgets its parent's instance in a forked child, so
    that hipObjInit there succeeds (the fake library may not yet): records
    every call, and answers success."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            first = args[0] if args and isinstance(args[0], int) else None
            self.calls.append((name, first))
            return hipobj._lib.ErrorT(0, 0)

        return call


def test_a_session_inherited_by_fork_initializes_afresh_where_the_library_allows(monkeypatch):
    lib = ForkAwareLibrary()
    monkeypatch.setattr(hipobj._lib, "library", lambda: lib)
    session = hipobj.Session(nic="client0")
    parents = [numpy.zeros(4096, numpy.uint8) for _ in range(2)]
    for array in parents:
        session.register(array)
    lib.calls.clear()
    # What os.register_at_fork runs in the child.
    hipobj._session._after_fork_in_child()
    assert lib.calls == [] and session.registered_count() == 0
    assert not session.release(parents[0]), "the parent's, forgotten"
    mine = numpy.zeros(4096, numpy.uint8)
    session.register(mine)
    assert session.available and session.registered_count() == 1
    session.close()
    assert lib.calls == [
        ("hipObjInit", None),
        ("hipObjBufRegisterHost", mine.ctypes.data),
        ("hipObjBufDeregister", mine.ctypes.data),
        ("hipObjShutdown", None),
    ]


# ---------------------------------------------------------------- integrity


def crc(data):
    """``x-amz-checksum-crc64nvme`` of `data`, as S3 writes it."""
    from awscrt import checksums

    return base64.b64encode(checksums.crc64nvme(bytes(data)).to_bytes(8, "big")).decode()


def headers_of(s3, method, key):
    """The headers of every `method` request for `key`, in order."""
    return [h for (m, k, _), h in zip(s3.fake.requests, s3.fake.headers) if m == method and k == key]


def test_an_rdma_get_into_host_memory_asks_for_the_server_s_crc_and_checks_the_bytes(s3, session):
    data = pattern(MIB + 3, 31)
    put(s3, "k", data)
    into = numpy.zeros(data.size, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert (t.path, t.verified, t.unverified) == ("rdma", True, None)
    assert numpy.array_equal(into, data)
    assert headers_of(s3, "GET", "k")[0].get("x-amz-checksum-mode") == "ENABLED"


def test_a_server_whose_crc_is_not_of_the_bytes_in_memory_fails_the_get_with_both(s3, session):
    data = pattern(4096, 32)
    put(s3, "k", data)
    s3.fake.rdma_checksum = "wrong"
    into = bytearray(4096)
    with pytest.raises(hipobj.TransferError) as e:
        session.get_object(s3, Bucket="bucket", Key="k", into=into)
    text = str(e.value)
    assert "not the bytes the server says it wrote" in text, text
    assert crc(data) in text, text
    assert crc(data.tobytes()[:-1] + b"?") in text, text
    assert session.stats.failed == 1 and session.stats.rdma == 0


def test_an_rdma_reply_without_the_crc_fails_unless_verification_is_off(s3, fake):
    data = pattern(4096, 33)
    put(s3, "k", data)
    s3.fake.rdma_checksum = "none"
    with hipobj.Session(gpu=0) as session:
        with pytest.raises(hipobj.TransferError) as e:
            session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(4096))
        assert "x-amz-rdma-checksum-crc64nvme" in str(e.value) and "verify=False" in str(e.value)
        into = bytearray(4096)
        t = session.get_object(s3, Bucket="bucket", Key="k", into=into, verify=False)
        assert (t.path, t.verified, t.unverified) == ("rdma", False, "verify=False")
        assert bytes(into) == data.tobytes()
    with hipobj.Session(gpu=0, verify=False) as session:
        t = session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(4096))
        assert (t.path, t.verified) == ("rdma", False)
    # Not asked for: the server computes nothing.
    assert all("x-amz-checksum-mode" not in h for h in headers_of(s3, "GET", "k")[1:])


def test_gpu_memory_is_neither_checked_nor_checksummed_and_says_so(s3, session, fake):
    data = pattern(MIB, 34)
    put(s3, "k", data)
    s3.fake.rdma_checksum = "wrong"
    gpu = FakeCudaArray(fake, MIB)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=gpu)
    assert (t.path, t.verified) == ("rdma", False)
    assert "GPU memory is not verified" in t.unverified
    assert gpu.read() == data.tobytes()
    assert "x-amz-checksum-mode" not in headers_of(s3, "GET", "k")[0]
    t = session.put_object(s3, Bucket="bucket", Key="up", source=gpu)
    assert (t.path, t.verified) == ("rdma", False)
    sent = headers_of(s3, "PUT", "up")[0]
    assert not any(name.startswith("x-amz-checksum-") for name in sent), sent
    session.close()
    assert fake.hipobjFakeDeviceFree(gpu.ptr) == 0


def test_an_rdma_put_carries_the_crc_of_its_payload_and_not_botocore_s_of_the_empty_body(s3, session):
    source = pattern(2 * MIB + 1, 35)
    t = session.put_object(s3, Bucket="bucket", Key="up", source=source)
    assert (t.path, t.verified) == ("rdma", True)
    sent = headers_of(s3, "PUT", "up")[0]
    checksums = {k: v for k, v in sent.items() if k.startswith("x-amz-checksum-") or k == "x-amz-sdk-checksum-algorithm"}
    assert checksums == {"x-amz-checksum-crc64nvme": crc(source)}, checksums
    # A read-only source, through the bounce buffer.
    t = session.put_object(s3, Bucket="bucket", Key="ro", source=source.tobytes())
    assert headers_of(s3, "PUT", "ro")[0]["x-amz-checksum-crc64nvme"] == crc(source)
    # Off: no checksum at all (botocore's of the empty body would be wrong).
    t = session.put_object(s3, Bucket="bucket", Key="off", source=source, verify=False)
    assert (t.path, t.verified, t.unverified) == ("rdma", False, "verify=False")
    sent = headers_of(s3, "PUT", "off")[0]
    assert not any(k.startswith("x-amz-checksum-") for k in sent), sent
    assert s3.fake.objects[("bucket", "off")] == source.tobytes()


def test_a_put_whose_crc_is_not_its_payload_is_refused_bad_digest_and_stores_nothing(s3, session):
    source = pattern(MIB, 36)
    with pytest.raises(ValueError):
        session.put_object(s3, Bucket="bucket", Key="bad", source=source, ChecksumCRC64NVME=crc(b"x"))
    with pytest.raises(hipobj.TransferError) as e:
        session.put_object(s3, Bucket="bucket", Key="bad", source=source, verify=False, ChecksumCRC64NVME=crc(b"x"))
    assert e.value.s3_code == "BadDigest" and e.value.reply == "400", e.value
    assert ("bucket", "bad") not in s3.fake.objects


def test_a_multipart_upload_declares_full_object_crc64nvme_and_completes_with_the_whole_crc(s3, session):
    source = pattern(11 * MIB + 7, 37)
    t = session.upload(s3, Bucket="bucket", Key="big", source=source, part_size=5 * MIB)
    assert (t.parts, t.path, t.verified) == (3, "rdma", True)
    assert s3.fake.objects[("bucket", "big")] == source.tobytes()
    create = headers_of(s3, "POST", "big")[0]
    assert create["x-amz-checksum-algorithm"] == "CRC64NVME"
    assert create["x-amz-checksum-type"] == "FULL_OBJECT"
    parts = headers_of(s3, "PUT", "big")
    raw = source.tobytes()
    for number, sent in enumerate(parts):
        assert sent["x-amz-checksum-crc64nvme"] == crc(raw[number * 5 * MIB : (number + 1) * 5 * MIB])
    complete = headers_of(s3, "POST", "big")[1]
    assert complete["x-amz-checksum-crc64nvme"] == crc(raw), "the whole object's, from its parts'"
    assert complete["x-amz-checksum-type"] == "FULL_OBJECT"


def test_parts_crcs_combine_into_the_whole_object_s():
    from hipobj import _checksums

    raw = pattern(3 * MIB + 5, 38).tobytes()
    a, b, c = raw[:MIB], raw[MIB : 2 * MIB + 1], raw[2 * MIB + 1 :]
    whole = 0
    for piece in (a, b, c):
        whole = _checksums.combine(whole, _checksums.crc64nvme(piece), len(piece))
    assert whole == _checksums.crc64nvme(raw)
    assert _checksums.combine(_checksums.crc64nvme(a), 0, 0) == _checksums.crc64nvme(a)


def test_a_plain_answer_of_a_whole_object_is_checked_against_its_crc(s3, session, fake):
    source = pattern(MIB, 39)
    session.put_object(s3, Bucket="bucket", Key="k", source=source)
    assert fake.hipobjFakeSetServerBehaviour(1) == 0
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert (t.path, t.verified) == ("fallback", True)
    t = session.get_object(s3, Bucket="bucket", Key="k", into=bytearray(1000), Range="bytes=0-999")
    assert t.verified is False and "no checksum of its bytes" in t.unverified
    s3.fake.corrupt_plain = True
    with pytest.raises(hipobj.TransferError) as e:
        session.get_object(s3, Bucket="bucket", Key="k", into=into)
    assert crc(source) in str(e.value), e.value


# ---------------------------------------------------------------- many in flight


def in_flight_counter(s3, hold=0.0):
    """Counts the requests in flight through `s3` (the most at once in
    ``most``), holding each `hold` seconds before the fake S3 answers."""
    state = {"now": 0, "most": 0, "seen": 0}
    lock = threading.Lock()

    def before(**_):
        with lock:
            state["now"] += 1
            state["seen"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(hold)
        with lock:
            state["now"] -= 1

    s3.meta.events.register_first("before-send.s3", before, unique_id="hipobj-test-in-flight")
    return state


def test_futures_of_many_gets_and_puts_land_their_own_bytes_in_any_order(s3, session):
    for i in range(12):
        put(s3, f"k{i}", pattern(256 << 10, 40 + i))
    intos = [numpy.zeros(256 << 10, dtype=numpy.uint8) for _ in range(12)]
    futures = {
        session.get_object_async(s3, Bucket="bucket", Key=f"k{i}", into=into): i for i, into in enumerate(intos)
    }
    done = []
    for future in hipobj.as_completed(futures):
        t = future.result()
        assert (t.path, t.bytes, t.verified) == ("rdma", 256 << 10, True)
        done.append(futures[future])
    assert sorted(done) == list(range(12))
    for i, into in enumerate(intos):
        assert numpy.array_equal(into, pattern(256 << 10, 40 + i)), i
    sources = [pattern(128 << 10, 90 + i) for i in range(6)]
    ups = [session.put_object_async(s3, Bucket="bucket", Key=f"up{i}", source=src) for i, src in enumerate(sources)]
    assert all(f.result().path == "rdma" for f in ups)
    for i, src in enumerate(sources):
        assert s3.fake.objects[("bucket", f"up{i}")] == src.tobytes()
    assert session.stats.rdma == 18 and session.stats.failed == 0


def test_asyncio_coroutines_run_many_transfers_while_the_loop_runs_on(s3, session):
    for i in range(8):
        put(s3, f"a{i}", pattern(64 << 10, 60 + i))
    intos = [bytearray(64 << 10) for _ in range(8)]
    ticks = []

    async def clock():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.001)

    async def main():
        ticker = asyncio.ensure_future(clock())
        got = await asyncio.gather(
            *(session.aget_object(s3, Bucket="bucket", Key=f"a{i}", into=into) for i, into in enumerate(intos))
        )
        sent = await session.aput_object(s3, Bucket="bucket", Key="back", source=bytearray(intos[3]))
        ticker.cancel()
        return got, sent

    got, sent = asyncio.run(main())
    assert [t.path for t in got] == ["rdma"] * 8
    for i, into in enumerate(intos):
        assert bytes(into) == pattern(64 << 10, 60 + i).tobytes(), i
    assert sent.path == "rdma" and s3.fake.objects[("bucket", "back")] == bytes(intos[3])
    assert len(ticks) > 1, "the event loop ran while the transfers did"


def test_a_batch_returns_results_in_order_and_its_first_failure(s3, session):
    for i in range(6):
        put(s3, f"b{i}", pattern(32 << 10, i))
    intos = [bytearray(32 << 10) for _ in range(6)]
    requests = [dict(Bucket="bucket", Key=f"b{i}", into=into) for i, into in enumerate(intos)]
    results = session.get_objects(s3, requests)
    assert [t.bytes for t in results] == [32 << 10] * 6
    assert [bytes(b) for b in intos] == [pattern(32 << 10, i).tobytes() for i in range(6)]
    # One missing object among them: raised once all have ended, or kept
    # in its place.
    requests[2] = dict(Bucket="bucket", Key="missing", into=bytearray(32 << 10))
    with pytest.raises(hipobj.TransferError, match="NoSuchKey"):
        session.get_objects(s3, requests)
    mixed = session.get_objects(s3, requests, return_exceptions=True)
    assert isinstance(mixed[2], hipobj.TransferError) and "NoSuchKey" in str(mixed[2])
    assert [t.path for i, t in enumerate(mixed) if i != 2] == ["rdma"] * 5
    ups = session.put_objects(s3, [dict(Bucket="bucket", Key=f"c{i}", source=bytearray(intos[i])) for i in range(3)])
    assert [t.path for t in ups] == ["rdma"] * 3
    # A buffer that cannot be used is refused at submission, before any request.
    with pytest.raises(hipobj.UnusableBufferError):
        session.get_object_async(s3, Bucket="bucket", Key="b0", into=b"read-only")


def test_no_more_than_max_in_flight_run_at_once(s3, fake):
    for i in range(9):
        put(s3, f"m{i}", pattern(16 << 10, i))
    state = in_flight_counter(s3, hold=0.05)
    with hipobj.Session(gpu=0, max_in_flight=3) as session:
        intos = [bytearray(16 << 10) for _ in range(9)]
        session.get_objects(s3, [dict(Bucket="bucket", Key=f"m{i}", into=b) for i, b in enumerate(intos)])
    assert state["seen"] == 9
    assert state["most"] == 3, state
    with pytest.raises(ValueError, match="max_in_flight"):
        hipobj.Session(gpu=0, max_in_flight=0)


def test_closing_a_session_cancels_what_has_not_started_and_waits_for_the_rest(s3, fake):
    for i in range(4):
        put(s3, f"q{i}", pattern(16 << 10, 7 + i))
    in_flight_counter(s3, hold=0.2)
    mrs = fake.hipobjFakeLiveObjects(b"mr")
    session = hipobj.Session(gpu=0, max_in_flight=1)
    intos = [bytearray(16 << 10) for _ in range(4)]
    futures = [session.get_object_async(s3, Bucket="bucket", Key=f"q{i}", into=b) for i, b in enumerate(intos)]
    time.sleep(0.05)
    session.close()
    assert futures[0].result().path == "rdma", "the running transfer ends first"
    assert bytes(intos[0]) == pattern(16 << 10, 7).tobytes()
    assert all(f.cancelled() for f in futures[1:])
    assert all(b == bytearray(16 << 10) for b in intos[1:]), "nothing landed in a cancelled transfer's buffer"
    assert fake.hipobjFakeLiveObjects(b"mr") == mrs, "every registration went with the session"


def test_transfer_threads_wait_in_the_library_with_the_gil_released(s3, session, fake):
    put(s3, "slow", pattern(MIB, 3))
    into = numpy.zeros(MIB, dtype=numpy.uint8)
    # No final message: the transfer waits in the library for its
    # completion time-out (300 ms here).
    assert fake.hipobjFakeSetServerBehaviour(2) == 0
    future = session.get_object_async(s3, Bucket="bucket", Key="slow", into=into)
    spins = 0
    while not future.done():
        spins += 1
    assert spins > 1000, f"the main thread ran {spins} loops while the transfer waited"
    with pytest.raises(hipobj.TransferError, match="hipObjRdmaError"):
        future.result()
    assert fake.hipobjFakeSetServerBehaviour(0) == 0
    assert session.get_object_async(s3, Bucket="bucket", Key="slow", into=into).result().path == "rdma"


def hold_first_request(s3, event="before-send.s3"):
    """Holds the first request through `s3` at botocore's `event` until
    ``release`` is set (``arrived`` is set once it is held); ``answered`` is
    set once a request's call returned (``after-call``: with a token, the
    fake server's RDMA is done by then)."""
    state = {"arrived": threading.Event(), "release": threading.Event(), "answered": threading.Event()}

    def gate(**_):
        if not state["arrived"].is_set():
            state["arrived"].set()
            assert state["release"].wait(60), "the test released the request"

    def after(**_):
        state["answered"].set()

    s3.meta.events.register_first(event, gate, unique_id="hipobj-test-hold")
    s3.meta.events.register("after-call.s3", after, unique_id="hipobj-test-answered")
    return state


async def _cancel_while_held(task, held, when_raised):
    """Cancels `task` while its request is held, runs `when_raised` as soon
    as the task ends (what an application does once the call raised), then
    lets the request go and waits past the transfer's end."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, held["arrived"].wait, 60)
    task.add_done_callback(lambda _: when_raised())
    task.cancel()
    # A call that does not wait for its transfer ends within these turns.
    for _ in range(20):
        await asyncio.sleep(0)
    held["release"].set()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_aget_object_raises_only_once_nothing_more_can_land_in_its_buffer(s3, session):
    n = 256 << 10
    put(s3, "held", pattern(n, 13))
    into = bytearray(n)
    held = hold_first_request(s3)

    def reuse():
        into[:] = b"\xaa" * n

    async def main():
        task = asyncio.ensure_future(session.aget_object(s3, Bucket="bucket", Key="held", into=into))
        await _cancel_while_held(task, held, reuse)
        # Past the end of the transfer whose request went before the cancel.
        assert held["answered"].wait(60)

    asyncio.run(main())
    assert bytes(into) == b"\xaa" * n, "the cancelled GET wrote into the buffer after the call raised"


def test_a_cancelled_aput_object_cannot_land_after_the_call_raised(s3, session):
    n = 256 << 10
    put(s3, "up", b"the version before")
    held = hold_first_request(s3)
    stored_when_raised = []

    async def main():
        task = asyncio.ensure_future(session.aput_object(s3, Bucket="bucket", Key="up", source=pattern(n, 5)))
        await _cancel_while_held(task, held, lambda: stored_when_raised.append(s3.fake.objects[("bucket", "up")]))
        assert held["answered"].wait(60)

    asyncio.run(main())
    # A PUT whose request was already at the server may be stored, but
    # before the call raised, never after.
    assert s3.fake.objects[("bucket", "up")] == stored_when_raised[0], "the cancelled PUT landed after the call raised"


def test_a_task_cancelled_before_its_request_leaves_sends_none(s3, fake):
    put(s3, "never", pattern(64 << 10, 3))
    into = bytearray(64 << 10)
    # Held before botocore signs it: the request has not left.
    held = hold_first_request(s3, "before-sign.s3")
    # One transfer thread: the next transfer runs once the first has ended.
    with hipobj.Session(gpu=0, max_in_flight=1) as session:

        async def main():
            task = asyncio.ensure_future(session.aget_object(s3, Bucket="bucket", Key="never", into=into))
            await _cancel_while_held(task, held, lambda: None)

        asyncio.run(main())
        again = bytearray(64 << 10)
        assert session.get_object_async(s3, Bucket="bucket", Key="never", into=again).result().path == "rdma"
    assert len([r for r in s3.fake.requests if r[1] == "never"]) == 1, "the cancelled task sent no request"
    assert into == bytearray(64 << 10)
    assert bytes(again) == pattern(64 << 10, 3).tobytes(), "the session went on"
