"""The model streamer's own libstreamer.so (runai-model-streamer 0.17.1 from
PyPI) driving our libstreamers3.so, through the wheel's ctypes layer, with no
torch and no GPU.

scripts/streamer-test.sh runs this file with LD_LIBRARY_PATH naming the
directory of our library, so that the streamer's dlopen("libstreamers3.so")
finds ours before the wheel's copy next to libstreamer.so. Environment it
sets: STREAMERS3_SITE (the wheels' --target directory), STREAMERS3_LIBRARY
(our .so), HIPOBJ_S3_SERVER (the gateway binary), HIPOBJ_STREAMER_STATS (the
backend's counters, as JSON, written at each runai_end).
"""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import types
from typing import Iterator, NamedTuple

import numpy as np
import pytest
from safetensors.numpy import save_file

SITE = pathlib.Path(os.environ["STREAMERS3_SITE"])
OURS = pathlib.Path(os.environ["STREAMERS3_LIBRARY"]).resolve()
WHEEL_BACKEND = SITE / "runai_model_streamer/libstreamer/lib/libstreamers3.so"
ACCESS, SECRET = "streamer-test", "streamer-test-secret"
BUCKET = "bkt"
CHUNK = 5 << 20

# The package's __init__ imports torch; its ctypes layer does not. An empty
# package module in its place lets the layer import alone.
_package = types.ModuleType("runai_model_streamer")
_package.__path__ = [str(SITE / "runai_model_streamer")]
sys.modules.setdefault("runai_model_streamer", _package)
from runai_model_streamer.libstreamer import libstreamer as ls  # noqa: E402
from runai_model_streamer.s3_utils.s3_utils import S3Credentials  # noqa: E402

SUCCESS, FILE_ACCESS, FILE_TRUNCATED = 0, 2, 15


class Range(NamedTuple):
    """One range of one object, and where it lands."""

    path: str
    offset: int
    size: int
    address: int


class Server:
    """hipobj-s3-server --no-rdma over a fresh root with bucket `bkt`."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        secret = root.parent / "secret"
        secret.write_text(SECRET + "\n")
        secret.chmod(0o600)
        self.proc = subprocess.Popen(
            [os.environ["HIPOBJ_S3_SERVER"], "--root", str(root), "--listen", "127.0.0.1:0",
             "--access-key", ACCESS, "--secret-key-file", str(secret), "--bucket", BUCKET,
             "--no-rdma"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+) \(rdma: ([^)]*)\)", line)
        assert m, f"the server's first line: {line!r}"
        self.endpoint = m.group(1)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / BUCKET / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Model(NamedTuple):
    """A sharded safetensors model stored on the server."""

    shards: dict[str, bytes]  # key -> the file's bytes
    tensors: dict[str, dict[str, np.ndarray]]  # key -> name -> array


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("s3")
    (base / "root").mkdir()
    server = Server(base / "root")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Model:
    """Two shards of several dtypes and shapes, one of them past three chunks."""
    rng = np.random.default_rng(34)
    shards = {
        "model/model-00001-of-00002.safetensors": {
            "embed.weight": rng.standard_normal((1024, 4096), dtype=np.float32),  # 16 MiB
            "layer0.bias": rng.standard_normal(3, dtype=np.float32),
            "layer0.ids": rng.integers(-(2**40), 2**40, size=(7, 11), dtype=np.int64),
        },
        "model/model-00002-of-00002.safetensors": {
            "layer1.weight": rng.standard_normal((512, 1000)).astype(np.float16),
            "layer1.mask": rng.integers(0, 2, size=(1,), dtype=np.uint8),
            "lm_head.weight": rng.standard_normal((300, 777), dtype=np.float32),
        },
    }
    scratch = tmp_path_factory.mktemp("model")
    files = {}
    for key, tensors in shards.items():
        path = scratch / pathlib.Path(key).name
        save_file(tensors, str(path))
        files[key] = path.read_bytes()
        server.put(key, files[key])
    server.put("model/config.json", b'{"architectures": ["Test"]}')
    server.put("model/sub/extra.bin", b"x" * 1000)
    return Model(files, shards)


def uri(key: str) -> str:
    return f"s3://{BUCKET}/{key}"


def start(endpoint: str) -> ctypes.c_void_p:
    streamer = ls.runai_start()
    ls.runai_set_credentials(
        streamer,
        S3Credentials(access_key_id=ACCESS, secret_access_key=SECRET, endpoint=endpoint),
    )
    return streamer


def submit(streamer: ctypes.c_void_p, ranges: list[Range]) -> int:
    """One submission of `ranges`, grouped by file in order of first use."""
    paths: list[str] = []
    by_path: dict[str, list[Range]] = {}
    for r in ranges:
        if r.path not in by_path:
            paths.append(r.path)
            by_path[r.path] = []
        by_path[r.path].append(r)
    ordered = [r for p in paths for r in by_path[p]]
    ranges[:] = ordered
    return ls.runai_request(
        streamer,
        paths,
        [len(by_path[p]) for p in paths],
        [r.offset for r in ordered],
        [r.size for r in ordered],
        [r.address for r in ordered],
    )


def stream(streamer: ctypes.c_void_p, ranges: list[Range], timeout_ms: int = 60_000) -> list[int]:
    """Submits `ranges` (reordered by file) and returns each one's code."""
    submission = submit(streamer, ranges)
    starts: list[int] = []
    counts: dict[int, int] = {}
    for i, r in enumerate(ranges):
        if i == 0 or r.path != ranges[i - 1].path:
            starts.append(i)
    codes: list[int | None] = [None] * len(ranges)
    done = False
    while not done:
        answer = ls.runai_response(streamer, timeout_ms)
        assert answer is not None, "teardown before the submission was done"
        code, sid, file_index, range_index, done = answer
        assert sid == submission
        slot = starts[file_index] + range_index
        assert codes[slot] is None, f"range {slot} answered twice"
        codes[slot] = code
        counts[file_index] = counts.get(file_index, 0) + 1
    assert all(c is not None for c in codes), f"unanswered ranges: {codes}"
    return [c for c in codes if c is not None]


def buffer(size: int, fill: int = 0xA5) -> ctypes.Array:
    return (ctypes.c_char * max(size, 1)).from_buffer_copy(bytes([fill]) * max(size, 1))


def stats() -> dict:
    return json.loads(pathlib.Path(os.environ["HIPOBJ_STREAMER_STATS"]).read_text())


def mapped() -> list[str]:
    return pathlib.Path("/proc/self/maps").read_text().splitlines()


def load_safetensors(streamer: ctypes.c_void_p, keys: list[str]) -> dict[str, dict[str, bytes]]:
    """What SafetensorsStreamer does: every header's length, every header,
    then every tensor's bytes, each a range of its own."""
    lengths = {k: buffer(8) for k in keys}
    codes = stream(streamer, [Range(uri(k), 0, 8, ctypes.addressof(lengths[k])) for k in keys])
    assert codes == [SUCCESS] * len(keys)
    sizes = {k: int.from_bytes(lengths[k].raw[:8], "little") for k in keys}
    headers = {k: buffer(sizes[k]) for k in keys}
    codes = stream(streamer, [Range(uri(k), 8, sizes[k], ctypes.addressof(headers[k])) for k in keys])
    assert codes == [SUCCESS] * len(keys)
    ranges, landing = [], {}
    for k in keys:
        header = json.loads(headers[k].raw[: sizes[k]])
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            dst = buffer(end - begin)
            landing[(k, name)] = (dst, end - begin)
            ranges.append(Range(uri(k), 8 + sizes[k] + begin, end - begin, ctypes.addressof(dst)))
    codes = stream(streamer, ranges)
    assert codes == [SUCCESS] * len(ranges)
    out: dict[str, dict[str, bytes]] = {k: {} for k in keys}
    for (k, name), (dst, size) in landing.items():
        out[k][name] = dst.raw[:size]
    return out


def test_every_tensor_of_a_sharded_model_streams_byte_exact(server: Server, model: Model) -> None:
    streamer = start(server.endpoint)
    try:
        keys = sorted(model.shards)
        got = load_safetensors(streamer, keys)
        # Our library is the one the streamer loaded, the wheel's is not.
        maps = mapped()
        assert any(line.endswith(str(OURS)) for line in maps), "our libstreamers3.so is mapped"
        assert not any(str(WHEEL_BACKEND) in line for line in maps), "the wheel's is not"
    finally:
        ls.runai_end(streamer)
    for key in keys:
        for name, array in model.tensors[key].items():
            assert got[key][name] == array.tobytes(), f"{key} {name}"
    # Over plain HTTP here (no RDMA device), and the counters say why.
    counted = stats()
    assert counted["http_reads"] >= 8, counted
    assert counted["rdma_reads"] == 0, counted
    assert any(why.startswith("no RDMA device") for why in counted["fallback_reasons"]), counted


def test_whole_files_in_one_submission_with_a_zero_length_range(server: Server, model: Model) -> None:
    streamer = start(server.endpoint)
    try:
        keys = sorted(model.shards)
        dsts = [buffer(len(model.shards[k])) for k in keys]
        empty = buffer(0)
        ranges = [Range(uri(k), 0, len(model.shards[k]), ctypes.addressof(d)) for k, d in zip(keys, dsts)]
        ranges.append(Range(uri(keys[0]), 100, 0, ctypes.addressof(empty)))
        codes = stream(streamer, ranges)
        assert codes == [SUCCESS] * len(ranges)
    finally:
        ls.runai_end(streamer)
    for key, dst in zip(keys, dsts):
        assert dst.raw == model.shards[key], key
    assert empty.raw == b"\xa5", "a zero-length range writes nothing"


def test_a_range_past_the_objects_end_is_code_15_not_data(server: Server, model: Model) -> None:
    key = "model/config.json"
    size = len(b'{"architectures": ["Test"]}')
    streamer = start(server.endpoint)
    try:
        short = buffer(size + 100, 0x5A)
        beyond = buffer(10, 0x5A)
        codes = stream(streamer, [
            Range(uri(key), size - 10, 110, ctypes.addressof(short)),  # 10 bytes exist
            Range(uri(key), size + 50, 10, ctypes.addressof(beyond)),  # none exist
        ])
    finally:
        ls.runai_end(streamer)
    assert codes == [FILE_TRUNCATED, FILE_TRUNCATED]


def test_a_missing_object_is_code_2(server: Server, model: Model) -> None:
    streamer = start(server.endpoint)
    try:
        dst = buffer(64)
        codes = stream(streamer, [Range(uri("model/missing.safetensors"), 0, 64, ctypes.addressof(dst))])
    finally:
        ls.runai_end(streamer)
    assert codes == [FILE_ACCESS]


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_RW, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED = 0x3, 0x02, 0x20, 0x10


def test_a_ring_freed_and_mapped_again_at_the_same_address(server: Server, model: Model) -> None:
    """The streamer's ring is freed and reallocated within one load, so one
    virtual address comes back on other pages: each read must land in the
    pages mapped when it was sent."""
    key = "model/model-00001-of-00002.safetensors"
    data = model.shards[key]
    size = 7 << 20  # two chunks a read; two reads fit the shard
    address = LIBC.mmap(None, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    assert address not in (None, ctypes.c_void_p(-1).value)
    streamer = start(server.endpoint)
    try:
        codes = stream(streamer, [Range(uri(key), 0, size, address)])
        assert codes == [SUCCESS]
        assert ctypes.string_at(address, size) == data[:size]
        assert LIBC.munmap(address, size) == 0
        again = LIBC.mmap(address, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        assert again == address, "mapped again at the same address"
        assert ctypes.string_at(address, 16) == bytes(16), "fresh pages"
        codes = stream(streamer, [Range(uri(key), size, size, address)])
        assert codes == [SUCCESS]
        assert ctypes.string_at(address, size) == data[size : 2 * size]
    finally:
        ls.runai_end(streamer)
        LIBC.munmap(address, size)


def test_listing_recursive_and_one_level(server: Server, model: Model) -> None:
    streamer = start(server.endpoint)
    try:
        found: dict[bool, list[tuple[str, int]]] = {}
        for recursive in (True, False):
            entries: list[tuple[str, int]] = []
            ls.runai_list_files(streamer, f"s3://{BUCKET}/model/", lambda p, s: entries.append((p, s)), recursive)
            found[recursive] = sorted(entries)
        empty: list[tuple[str, int]] = []
        ls.runai_list_files(streamer, f"s3://{BUCKET}/nothing-here/", lambda p, s: empty.append((p, s)), True)
    finally:
        ls.runai_end(streamer)
    top = sorted([(uri(k), len(v)) for k, v in model.shards.items()] + [(uri("model/config.json"), 27)])
    assert found[False] == top
    assert found[True] == sorted(top + [(uri("model/sub/extra.bin"), 1000)])
    assert empty == []


def test_two_streamers_in_one_process(server: Server, model: Model) -> None:
    """Policy 0: the backend stays open across streamers; two at once each
    get their own clients, and a third after both ended works."""
    keys = sorted(model.shards)
    first, second = start(server.endpoint), start(server.endpoint)
    try:
        a = buffer(len(model.shards[keys[0]]))
        b = buffer(len(model.shards[keys[1]]))
        sa = submit(first, ra := [Range(uri(keys[0]), 0, len(model.shards[keys[0]]), ctypes.addressof(a))])
        codes_b = stream(second, [Range(uri(keys[1]), 0, len(model.shards[keys[1]]), ctypes.addressof(b))])
        answer = ls.runai_response(first, 60_000)
        assert answer is not None and answer[0] == SUCCESS and answer[1] == sa and answer[4], answer
        assert len(ra) == 1
    finally:
        ls.runai_end(first)
        ls.runai_end(second)
    assert codes_b == [SUCCESS]
    assert a.raw == model.shards[keys[0]] and b.raw == model.shards[keys[1]]
    third = start(server.endpoint)
    try:
        c = buffer(1000)
        assert stream(third, [Range(uri("model/sub/extra.bin"), 0, 1000, ctypes.addressof(c))]) == [SUCCESS]
        assert c.raw == b"x" * 1000
    finally:
        ls.runai_end(third)


class Served(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 serving with `handler` on threads of its
    own from the moment it is made; the look-alikes' common part."""

    daemon_threads = True

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class LookAlike(Served):
    """A tiny S3 look-alike serving one body for any key, as S3 does
    ("plain"), or misbehaving as `behaviour` says: "stall" sends half of each ranged body, then waits
    for `release` before the rest; "long" sends 10 bytes more than the range
    (its Content-Length says so); "busy" answers 503 SlowDown."""

    def __init__(self, body: bytes, behaviour: str) -> None:
        self.body = body
        self.behaviour = behaviour
        self.release = threading.Event()
        self.stalled = threading.Semaphore(0)
        self.gets = 0
        self.authorizations: list[str | None] = []
        super().__init__(LookAlikeHandler)


class LookAlikeHandler(http.server.BaseHTTPRequestHandler):
    server: LookAlike
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (the http.server's name)
        self.server.gets += 1
        self.server.authorizations.append(self.headers.get("authorization"))
        if self.server.behaviour == "busy":
            error = b"<Error><Code>SlowDown</Code><Message>busy</Message></Error>"
            self.send_response(503)
            self.send_header("content-length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        m = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("range", ""))
        assert m, self.headers
        first, last = int(m.group(1)), int(m.group(2))
        if self.server.behaviour == "long":
            last += 10
        part = self.server.body[first : last + 1]
        self.send_response(206)
        self.send_header("content-length", str(len(part)))
        self.send_header("content-range", f"bytes {first}-{last}/{len(self.server.body)}")
        self.end_headers()
        if self.server.behaviour != "stall":
            self.wfile.write(part)
            return
        half = len(part) // 2
        try:
            self.wfile.write(part[:half])
            self.wfile.flush()
            self.server.stalled.release()
            self.server.release.wait(60)
            self.wfile.write(part[half:])
            self.wfile.flush()
        except OSError:
            pass


def test_a_body_longer_than_the_range_is_code_15() -> None:
    body = bytes(range(256)) * 64
    liar = LookAlike(body, "long")
    streamer = start(liar.endpoint)
    try:
        dst = buffer(1000, 0x11)
        codes = stream(streamer, [Range(uri("any/object"), 100, 1000, ctypes.addressof(dst))])
    finally:
        ls.runai_end(streamer)
        liar.shutdown()
    assert codes == [FILE_TRUNCATED]


@pytest.mark.parametrize("retries, gets", [(None, 1), ("2", 3)], ids=["by-default", "max-retries-2"])
def test_a_busy_server_is_retryable_which_the_outer_gives_as_2(
        monkeypatch: pytest.MonkeyPatch, retries: str | None, gets: int) -> None:
    """503 is code 19 from the backend (a 0.17 outer); with
    RUNAI_STREAMER_S3_TIMEOUT unset the outer does not retry and delivers 2.
    RUNAI_STREAMER_S3_MAX_RETRIES makes the backend send a transient failure
    again, that many more times: no retries by default."""
    if retries is not None:
        monkeypatch.setenv("RUNAI_STREAMER_S3_MAX_RETRIES", retries)
    busy = LookAlike(b"", "busy")
    streamer = start(busy.endpoint)
    try:
        dst = buffer(16)
        codes = stream(streamer, [Range(uri("any/object"), 0, 16, ctypes.addressof(dst))])
    finally:
        ls.runai_end(streamer)
        busy.shutdown()
    assert codes == [FILE_ACCESS]
    assert busy.gets == gets


def test_unsigned_requests_carry_no_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    body = bytes(range(200))
    plain = LookAlike(body, "plain")
    streamer = start(plain.endpoint)
    try:
        signed = buffer(50)
        assert stream(streamer, [Range(uri("any/object"), 10, 50, ctypes.addressof(signed))]) == [SUCCESS]
    finally:
        ls.runai_end(streamer)
    monkeypatch.setenv("RUNAI_STREAMER_S3_UNSIGNED", "1")
    streamer = start(plain.endpoint)
    try:
        unsigned = buffer(50)
        assert stream(streamer, [Range(uri("any/object"), 10, 50, ctypes.addressof(unsigned))]) == [SUCCESS]
    finally:
        ls.runai_end(streamer)
        plain.shutdown()
    assert signed.raw == unsigned.raw == body[10:60]
    first, second = plain.authorizations
    assert first is not None and first.startswith("AWS4-HMAC-SHA256 Credential=" + ACCESS), first
    assert second is None, second


def test_end_during_stalled_reads_returns_promptly_and_nothing_lands_after(tmp_path: pathlib.Path) -> None:
    body = bytes(range(256)) * (4 << 12)  # 1 MiB
    stalling = LookAlike(body, "stall")
    endpoint = stalling.endpoint
    canary = 0xC3
    dsts = [buffer(len(body) // 2, canary), buffer(len(body) // 2, canary)]
    streamer = start(endpoint)
    try:
        submit(streamer, [
            Range(uri("stall/object"), 0, len(body) // 2, ctypes.addressof(dsts[0])),
            Range(uri("stall/object"), len(body) // 2, len(body) // 2, ctypes.addressof(dsts[1])),
        ])
        for _ in dsts:
            assert stalling.stalled.acquire(timeout=30), "both GETs reached the server and stalled"
        time.sleep(0.5)  # the halves sent are copied in
    finally:
        began = time.monotonic()
        ls.runai_end(streamer)
        took = time.monotonic() - began
    at_end = [d.raw for d in dsts]
    stalling.release.set()  # the rest of each body goes out now
    time.sleep(1.5)
    stalling.shutdown()
    assert took < 5, f"runai_end took {took:.1f} s while the reads stalled"
    for before, dst in zip(at_end, dsts):
        assert dst.raw == before, "bytes landed after runai_end returned"
        assert dst.raw[-1] == canary, "the stalled half never landed"


STOCK = r"""
import ctypes, json, sys, types
site, endpoint, key, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
package = types.ModuleType("runai_model_streamer")
package.__path__ = [site + "/runai_model_streamer"]
sys.modules["runai_model_streamer"] = package
from runai_model_streamer.libstreamer import libstreamer as ls
from runai_model_streamer.s3_utils.s3_utils import S3Credentials
s = ls.runai_start()
ls.runai_set_credentials(s, S3Credentials(access_key_id="%s", secret_access_key="%s", endpoint=endpoint))
dst = ctypes.create_string_buffer(size)
ls.runai_request(s, ["s3://%s/" + key], [1], [0], [size], [ctypes.addressof(dst)])
answer = ls.runai_response(s, 60000)
maps = open("/proc/self/maps").read()
ls.runai_end(s)
sys.stdout.buffer.write(json.dumps({"code": answer[0], "stock": "lib/libstreamers3.so" in maps}).encode() + b"\n")
sys.stdout.buffer.flush()
sys.stdout.buffer.write(dst.raw)
""" % (ACCESS, SECRET, BUCKET)


def test_the_stock_backend_reads_the_same_bytes(server: Server, model: Model) -> None:
    """The wheel's own libstreamers3.so, through the same gateway, gives the
    bytes ours gave (a comparison of the setup, not of our code)."""
    key = sorted(model.shards)[1]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true")
    out = subprocess.run(
        [sys.executable, "-c", STOCK, str(SITE), server.endpoint, key, str(len(model.shards[key]))],
        env=env, capture_output=True, timeout=120, check=True,
    ).stdout
    head, _, data = out.partition(b"\n")
    result = json.loads(head)
    assert result == {"code": SUCCESS, "stock": True}, result
    assert data == model.shards[key]


def test_a_missing_ca_bundle_is_code_10(server: Server, model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend reads its environment at each client it makes."""
    monkeypatch.setenv("AWS_CA_BUNDLE", "/nonexistent/ca.pem")
    streamer = start(server.endpoint)
    try:
        dst = buffer(8)
        codes = stream(streamer, [Range(uri("model/config.json"), 0, 8, ctypes.addressof(dst))])
    finally:
        ls.runai_end(streamer)
    assert codes == [10]


def test_the_abi_calls_directly(server: Server, model: Model) -> None:
    """What the outer never sends but the contract fixes: the window's
    answer for too small a buffer, an unknown key, NULL arguments, and
    freeing an empty listing."""
    streamer = start(server.endpoint)  # a reading client sets the window
    try:
        dst = buffer(8)
        assert stream(streamer, [Range(uri("model/config.json"), 0, 8, ctypes.addressof(dst))]) == [SUCCESS]
    finally:
        ls.runai_end(streamer)
    lib = ctypes.CDLL(str(OURS))
    out = ctypes.create_string_buffer(32)
    room = ctypes.c_uint(32)
    get = lib.obj_get_backend_config
    get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint)]
    assert get(None, b"max_inflight_bytes", out, ctypes.byref(room)) == 0
    value = out.value
    assert value.isdigit() and room.value == len(value), (value, room.value)
    # The stock default: 10 Gbps for 0.1 s with a margin of 1.5.
    assert int(value) == 187_500_000
    room = ctypes.c_uint(4)
    assert get(None, b"max_inflight_bytes", out, ctypes.byref(room)) == 11
    assert room.value == len(value) + 1, "the size needed, with the NUL"
    room = ctypes.c_uint(32)
    assert get(None, b"no_such_key", out, ctypes.byref(room)) == 11
    lib.obj_list_files.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    assert lib.obj_list_files(None, b"s3://bkt/", 1, None, None) == 7
    lib.obj_wait_for_completions.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_int]
    assert lib.obj_wait_for_completions(None, None, 1, None, 1) == 11
    lib.obj_free_file_list.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.obj_free_file_list(None, 0)
    assert lib.obj_get_backend_shutdown_policy() == 0


def test_a_listing_longer_than_one_page(server: Server, model: Model) -> None:
    """ListObjectsV2 answers at most 1000 keys a page: the backend follows
    the continuation tokens. The prefix is the URI's key verbatim, as S3
    takes it: `many` lists everything under it recursively, and one level
    of it only with the slash (without, one level is the common prefix
    `many/`, which is no object)."""
    keys = [f"many/{i:05d}" for i in range(1203)]
    for key in keys:
        server.put(key, b"")
    server.put("many/deeper/last", b"1")
    streamer = start(server.endpoint)
    try:
        found: dict[bool, list[tuple[str, int]]] = {True: [], False: []}
        for recursive, prefix in ((True, "many"), (False, "many/")):
            ls.runai_list_files(
                streamer, f"s3://{BUCKET}/{prefix}", lambda p, s, r=recursive: found[r].append((p, s)), recursive)
    finally:
        ls.runai_end(streamer)
    assert sorted(found[True]) == sorted([(uri(k), 0) for k in keys] + [(uri("many/deeper/last"), 1)])
    assert sorted(found[False]) == sorted([(uri(k), 0) for k in keys])


def test_keys_and_endpoint_from_the_environment(
    server: Server, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM sets no credentials: the endpoint comes from AWS_ENDPOINT_URL
    (through the outer), the keys from the backend's own environment."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    streamer = ls.runai_start()
    try:
        dst = buffer(27)
        assert stream(streamer, [Range(uri("model/config.json"), 0, 27, ctypes.addressof(dst))]) == [SUCCESS]
        assert dst.raw == b'{"architectures": ["Test"]}'
    finally:
        ls.runai_end(streamer)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    streamer = ls.runai_start()
    try:
        dst = buffer(27)
        assert stream(streamer, [Range(uri("model/config.json"), 0, 27, ctypes.addressof(dst))]) == [FILE_ACCESS]
    finally:
        ls.runai_end(streamer)
