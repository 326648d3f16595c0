"""The RDMA path of libstreamers3.so under the streamer's own 0.17.1 outer,
on a host without an RDMA device: the library is a test build
(`--features fake-world`) that runs on hipobj's fake RDMA world
(HIPOBJ_TEST_WORLD=1: an in-process fabric whose server writes into the
client's registered memory), and the S3 side is a look-alike in this process
that hands each GET's token to that world's server, as the gateway hands it
to its own.

What it shows: every read goes by RDMA into the streamer's ring, its
destination registered for that request only and deregistered before the
completion is delivered (no memory registration is left once a read has
answered), a ring freed and mapped again at the same address gets the new
pages' bytes, and a short read is still code 15.

scripts/streamer-test.sh runs it in a process of its own, with
LD_LIBRARY_PATH naming the test build's directory.
"""

from __future__ import annotations

import base64
import ctypes
import http.server
import os
import re
import threading
import time

import pytest
from awscrt import checksums

from test_streamer import (
    FILE_TRUNCATED,
    LIBC,
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    OURS,
    PROT_RW,
    SUCCESS,
    Range,
    Served,
    buffer,
    ls,
    mapped,
    start,
    stats,
    stream,
    submit,
    uri,
)

if os.environ.get("HIPOBJ_TEST_WORLD") != "1":
    pytest.fail("the fake world's tests run with HIPOBJ_TEST_WORLD=1 (scripts/streamer-test.sh)")

WORLD = ctypes.CDLL(str(OURS))  # the test build: the world's controls
WORLD.hipobjFakeSetObject.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
WORLD.hipobjFakeServe.argtypes = [ctypes.c_char_p, ctypes.c_int]
GET = 1  # HIPOBJ_RDMA_OP_GET


class RdmaLookAlike(Served):
    """Serves `objects` (key -> bytes): a GET with a token is handed to the
    fake world's server, which writes the range by RDMA; the answer carries
    the reply, the byte count and the CRC64/NVME of the bytes written, as
    hipobj-s3-server's do."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.lock = threading.Lock()  # the world's store holds one object
        self.by_rdma = 0
        #: Set: GETs wait for `release` before serving their token.
        self.stall = threading.Event()
        self.release = threading.Event()
        self.stalled = threading.Semaphore(0)
        self.late_replies: list[int] = []
        super().__init__(RdmaHandler)


class RdmaHandler(http.server.BaseHTTPRequestHandler):
    server: RdmaLookAlike
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def answer(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (the http.server's name)
        key = self.path.split("?")[0].split("/", 2)[2]
        data = self.server.objects[key]
        m = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("range", ""))
        assert m, self.headers
        first, last = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
        if first >= len(data):
            self.answer(416, {"x-amz-rdma-reply": "416"}, b"<Error><Code>InvalidRange</Code></Error>")
            return
        piece = data[first : last + 1]
        token = self.headers.get("x-amz-rdma-token")
        assert token, "every read tries RDMA"
        late = self.server.stall.is_set()
        if late:
            self.server.stalled.release()
            self.server.release.wait(60)
        with self.server.lock:
            assert WORLD.hipobjFakeSetObject(piece, len(piece)) == 0
            reply = WORLD.hipobjFakeServe(token.encode(), GET)
            self.server.by_rdma += 1
        if late:
            self.server.late_replies.append(reply)
        crc = base64.b64encode(checksums.crc64nvme(piece).to_bytes(8, "big")).decode()
        self.answer(206, {
            "x-amz-rdma-reply": str(206 if reply in (200, 206) else reply),
            "x-amz-rdma-bytes-transferred": str(len(piece)),
            "x-amz-rdma-checksum-crc64nvme": crc,
            "content-range": f"bytes {first}-{last}/{len(data)}",
        })


@pytest.fixture
def look_alike() -> RdmaLookAlike:
    objects = {
        "model/a.bin": bytes((i * 7 + 3) % 251 for i in range(3 << 20)),
        "model/b.bin": os.urandom(300_000),
    }
    server = RdmaLookAlike(objects)
    yield server
    server.shutdown()


def test_reads_go_by_rdma_into_memory_registered_per_request(look_alike: RdmaLookAlike) -> None:
    a, b = look_alike.objects["model/a.bin"], look_alike.objects["model/b.bin"]
    streamer = start(look_alike.endpoint)
    try:
        dst_a, dst_b = buffer(len(a)), buffer(len(b))
        ranges = [Range(uri("model/a.bin"), 0, len(a), ctypes.addressof(dst_a)),
                  Range(uri("model/b.bin"), 0, len(b), ctypes.addressof(dst_b))]
        assert stream(streamer, ranges) == [SUCCESS, SUCCESS]
        assert any(line.endswith(str(OURS)) for line in mapped())
        # One read at a time, each answered before the next is sent.
        for offset in (0, 1 << 20, len(a) - 10):
            one = buffer(10)
            assert stream(streamer, [Range(uri("model/a.bin"), offset, 10, ctypes.addressof(one))]) == [SUCCESS]
            assert one.raw == a[offset : offset + 10]
    finally:
        ls.runai_end(streamer)
    assert dst_a.raw == a and dst_b.raw == b
    counted = stats()
    assert counted["rdma_reads"] == look_alike.by_rdma == 5, counted
    assert counted["http_reads"] == 0, counted
    # Every read's registration was given back.
    assert counted["registered_buffers"] == 0, counted


def test_a_ring_mapped_again_at_the_same_address_gets_its_bytes_by_rdma(look_alike: RdmaLookAlike) -> None:
    """Pages freed and mapped again at one address between two requests:
    a registration kept by address would have the first pages' frames, and
    the second read's bytes would not be in the new pages."""
    a = look_alike.objects["model/a.bin"]
    size = 1 << 20
    address = LIBC.mmap(None, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    streamer = start(look_alike.endpoint)
    try:
        assert stream(streamer, [Range(uri("model/a.bin"), 0, size, address)]) == [SUCCESS]
        assert ctypes.string_at(address, size) == a[:size]
        assert LIBC.munmap(address, size) == 0
        again = LIBC.mmap(address, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        assert again == address
        assert stream(streamer, [Range(uri("model/a.bin"), size, size, address)]) == [SUCCESS]
        assert ctypes.string_at(address, size) == a[size : 2 * size]
    finally:
        ls.runai_end(streamer)
        LIBC.munmap(address, size)
    assert stats()["registered_buffers"] == 0


def test_a_short_object_by_rdma_is_code_15(look_alike: RdmaLookAlike) -> None:
    b = look_alike.objects["model/b.bin"]
    streamer = start(look_alike.endpoint)
    try:
        dst = buffer(1000, 0x33)
        beyond = buffer(10, 0x33)
        codes = stream(streamer, [Range(uri("model/b.bin"), len(b) - 100, 1000, ctypes.addressof(dst)),
                                  Range(uri("model/b.bin"), len(b) + 5, 10, ctypes.addressof(beyond))])
    finally:
        ls.runai_end(streamer)
    assert codes == [FILE_TRUNCATED, FILE_TRUNCATED]


def test_end_during_stalled_rdma_reads_returns_within_the_request_timeout(
    look_alike: RdmaLookAlike, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RDMA read's memory is registered until its request ends: the
    removal waits for that, at most the request time-out, and a token the
    server serves after it writes nothing."""
    monkeypatch.setenv("RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS", "1500")
    look_alike.stall.set()
    canary = 0x4B
    dst = buffer(4096, canary)
    streamer = start(look_alike.endpoint)
    try:
        submit(streamer, [Range(uri("model/a.bin"), 0, 4096, ctypes.addressof(dst))])
        assert look_alike.stalled.acquire(timeout=30), "the GET reached the server"
    finally:
        began = time.monotonic()
        ls.runai_end(streamer)
        took = time.monotonic() - began
    look_alike.release.set()  # the server serves the token now
    deadline = time.monotonic() + 10
    while not look_alike.late_replies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert took < 5, f"runai_end took {took:.1f} s"
    assert look_alike.late_replies and look_alike.late_replies[0] not in (200, 206), look_alike.late_replies
    assert dst.raw == bytes([canary]) * 4096, "nothing landed after runai_end"
    assert stats()["registered_buffers"] == 0
