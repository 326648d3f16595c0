"""Inside the VM, inside scripts/vm/streamer-guest.sh (a gateway by RDMA in
front of the lane's Garage cluster): the Run:ai model streamer's outer
library (``libstreamer.so`` of the runai-model-streamer 0.17.1 wheel,
driven by ctypes, no torch) streaming a sharded safetensors model from
the gateway, with hipobj's ``libstreamers3.so`` loaded in place of the
wheel's own S3 backend, or with the wheel's own (the stock backend).

  streamer-lane.py check   the test: the model streamed by ours, byte for
                           byte against the files, and by RDMA: the
                           gateway's metrics must count every byte as an
                           RDMA GET and none as an HTTP GET, and the
                           backend mapped must be ours. Fails otherwise.
  streamer-lane.py bench   the measurement: the same model streamed by the
                           stock backend and by ours in turn, ROUNDS each
                           (after one warm-up each), every stream checked
                           as in ``check``; wall time, throughput and the
                           streaming process's CPU seconds per GiB, as a
                           table.
  streamer-lane.py stream  one stream in a process of its own (the two
                           modes above run it): prints its figures as JSON.

Each stream runs in a fresh process: the backend is chosen at its start
(LD_LIBRARY_PATH naming the directory of ours, which the dynamic loader
searches before the wheel's own directory, model-streamer.md §2.4), and
its CPU time (``getrusage(RUSAGE_SELF)``: every thread of the process, the
outer's workers and the backend's included) is that stream's alone.

The settings come from the environment, which streamer-guest.sh sets:

  HIPOBJ_STREAMER_SITE      the directory the two wheels were installed into
  HIPOBJ_STREAMER_OURS      the directory holding our libstreamers3.so
  HIPOBJ_STREAMER_METRICS   the gateway's metrics URL
  AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   the gateway
  HIPOBJ_GARAGE_ENDPOINT, HIPOBJ_GARAGE_REGION, HIPOBJ_GARAGE_KEY,
  HIPOBJ_GARAGE_SECRET, HIPOBJ_GARAGE_BUCKET   Garage, where the model is put

Usage: streamer-lane.py check|bench [--shards N] [--shard-mib M] [--rounds R]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy
from safetensors.numpy import save_file

MIB = 1 << 20
GIB = 1 << 30
# One range's answer may take this long on the emulated VM before the
# stream is called stuck.
RESPONSE_TIMEOUT_MS = 300_000
# The outer's codes (model-streamer.md §1.4) the loop below tells apart.
CODE_SUCCESS = 0
CODE_FINISHED = 1
CODE_TIMED_OUT = 16


class LaneError(Exception):
    """A check of the lane that did not hold; the message says which."""


# --- the model ---------------------------------------------------------------


def make_model(directory: Path, shards: int, shard_mib: int) -> list[Path]:
    """Writes SHARDS safetensors files of about SHARD_MIB MiB each, named as
    a sharded checkpoint is: each a model's layers, a float16 matrix of up
    to 16 MiB and a float32 bias. Their values are random bits (any bit
    pattern is a value to a loader; the VM's emulated CPU draws bits far
    faster than normal deviates)."""
    rng = numpy.random.default_rng(34)

    def random(dtype: type, shape: tuple[int, ...]) -> numpy.ndarray:
        count = int(numpy.prod(shape))
        return numpy.frombuffer(rng.bytes(count * numpy.dtype(dtype).itemsize), dtype=dtype).reshape(shape)

    paths = []
    for shard in range(shards):
        tensors: dict[str, numpy.ndarray] = {}
        left = shard_mib * MIB
        layer = 0
        while left > 0:
            rows = max(1, min(4096, left // (2 * 2048)))
            weight = random(numpy.float16, (rows, 2048))
            bias = random(numpy.float32, (rows,))
            tensors[f"model.layers.{shard}.{layer}.weight"] = weight
            tensors[f"model.layers.{shard}.{layer}.bias"] = bias
            left -= weight.nbytes + bias.nbytes
            layer += 1
        path = directory / f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(path))
        paths.append(path)
    return paths


def upload(paths: list[Path], bucket: str, prefix: str) -> list[str]:
    """Puts each file into BUCKET/PREFIX/ in Garage itself, with curl (plain
    HTTP, SigV4 with Garage's key: the quickest way in; what is tested is
    the reading), and returns their s3:// URIs."""
    uris = []
    for path in paths:
        key = f"{prefix}/{path.name}"
        subprocess.run(
            [
                "curl", "-sS", "--fail-with-body", "-o", "/dev/null", "--upload-file", str(path),
                "--aws-sigv4", f"aws:amz:{os.environ['HIPOBJ_GARAGE_REGION']}:s3",
                "--user", f"{os.environ['HIPOBJ_GARAGE_KEY']}:{os.environ['HIPOBJ_GARAGE_SECRET']}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                f"{os.environ['HIPOBJ_GARAGE_ENDPOINT']}/{bucket}/{key}",
            ],
            check=True,
        )
        uris.append(f"s3://{bucket}/{key}")
    return uris


# --- one stream, in a process of its own --------------------------------------


class _Device(ctypes.Structure):
    """The outer's by-value device argument: type 0, id 0 is the CPU."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Streamer:
    """The outer library's C API of 0.17.1 (model-streamer.md §2.2),
    declared here rather than through the wheel's Python package, whose
    ``__init__`` imports torch."""

    def __init__(self, site: Path) -> None:
        path = site / "runai_model_streamer" / "libstreamer" / "lib" / "libstreamer.so"
        if not path.is_file():
            raise LaneError(f"no {path}: install runai-model-streamer==0.17.1 into {site} (pip --target)")
        lib = ctypes.CDLL(str(path))
        lib.runai_file_streamer_start.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.runai_file_streamer_start.restype = ctypes.c_int
        lib.runai_file_streamer_end.argtypes = [ctypes.c_void_p]
        lib.runai_file_streamer_end.restype = None
        lib.runai_file_streamer_request.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_void_p),
            _Device,
        ]
        lib.runai_file_streamer_request.restype = ctypes.c_int
        lib.runai_file_streamer_response.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_uint,
        ]
        lib.runai_file_streamer_response.restype = ctypes.c_int
        lib.runai_file_streamer_response_str.argtypes = [ctypes.c_int]
        lib.runai_file_streamer_response_str.restype = ctypes.c_char_p
        self._lib = lib
        handle = ctypes.c_void_p()
        self._check(lib.runai_file_streamer_start(ctypes.byref(handle)), "runai_file_streamer_start")
        self._handle = handle

    def _check(self, code: int, what: str) -> None:
        if code != CODE_SUCCESS:
            text = self._lib.runai_file_streamer_response_str(code).decode(errors="replace")
            raise LaneError(f"{what}: code {code} ({text})")

    def read(self, uris: list[str], ranges: list[list[tuple[int, numpy.ndarray]]]) -> None:
        """One submission: for each file, its ranges as (offset, buffer),
        each buffer filled with the bytes from offset on; returns when every
        range has answered, and fails on the first that answers with an
        error."""
        count = sum(len(r) for r in ranges)
        paths = (ctypes.c_char_p * len(uris))(*(u.encode() for u in uris))
        per_file = (ctypes.c_uint32 * len(uris))(*(len(r) for r in ranges))
        flat = [item for r in ranges for item in r]
        offsets = (ctypes.c_size_t * count)(*(offset for offset, _ in flat))
        sizes = (ctypes.c_size_t * count)(*(buffer.nbytes for _, buffer in flat))
        destinations = (ctypes.c_void_p * count)(*(buffer.ctypes.data for _, buffer in flat))
        submission = ctypes.c_uint64()
        self._check(
            self._lib.runai_file_streamer_request(
                self._handle, ctypes.byref(submission), len(uris), paths, per_file, offsets, sizes,
                destinations, _Device(0, 0),
            ),
            "runai_file_streamer_request",
        )
        answered: set[tuple[int, int]] = set()
        while True:
            sid, file_index, range_index, done = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_int()
            code = self._lib.runai_file_streamer_response(
                self._handle, ctypes.byref(sid), ctypes.byref(file_index), ctypes.byref(range_index),
                ctypes.byref(done), RESPONSE_TIMEOUT_MS,
            )
            if code == CODE_TIMED_OUT:
                raise LaneError(f"no answer within {RESPONSE_TIMEOUT_MS} ms ({len(answered)} of {count} ranges answered)")
            if code == CODE_FINISHED:
                raise LaneError(f"the streamer tore down with {count - len(answered)} ranges unanswered")
            uri = uris[file_index.value] if file_index.value < len(uris) else f"file {file_index.value}"
            self._check(code, f"range {range_index.value} of {uri}")
            answered.add((file_index.value, range_index.value))
            if done.value:
                break
        if len(answered) != count:
            raise LaneError(f"the submission ended with {len(answered)} of {count} ranges answered")

    def end(self) -> None:
        self._lib.runai_file_streamer_end(self._handle)


def cpu_jiffies() -> int:
    """The whole machine's busy CPU time so far, in clock ticks (/proc/stat:
    every process, the kernel's own work such as rxe's included)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def mapped_backends() -> list[str]:
    """The files named libstreamers3.so mapped into this process."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip().endswith("/libstreamers3.so"):
                found.add(os.path.realpath(fields[5].strip()))
    return sorted(found)


def stream(uris: list[str], files: list[Path]) -> dict[str, object]:
    """Streams the safetensors files at URIS into host memory as the
    streamer's SafetensorsStreamer does (each file's 8-byte header length,
    then its header, then its tensors' bytes, one submission each), then
    checks the bytes against FILES. Returns the figures."""
    busy0 = cpu_jiffies()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    streamer = Streamer(Path(os.environ["HIPOBJ_STREAMER_SITE"]))
    try:  # the buffers stay referenced until the streamer has ended
        lengths = [numpy.empty(8, dtype=numpy.uint8) for _ in uris]
        streamer.read(uris, [[(0, b)] for b in lengths])
        header_sizes = [int.from_bytes(b.tobytes(), "little") for b in lengths]
        headers = [numpy.empty(n, dtype=numpy.uint8) for n in header_sizes]
        streamer.read(uris, [[(8, b)] for b in headers])
        data_sizes = [f.stat().st_size - 8 - n for f, n in zip(files, header_sizes)]
        # The tensors' bytes land in one buffer per tensor, as the outer's
        # Python layer hands them to a loader.
        tensors: list[list[tuple[int, numpy.ndarray]]] = []
        for header, n in zip(headers, header_sizes):
            meta = json.loads(header.tobytes())
            spans = sorted(v["data_offsets"] for k, v in meta.items() if k != "__metadata__")
            tensors.append([(8 + n + a, numpy.empty(b - a, dtype=numpy.uint8)) for a, b in spans if b > a])
        streamer.read(uris, tensors)
    finally:
        streamer.end()
    wall = time.perf_counter() - start
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    busy1 = cpu_jiffies()
    backends = mapped_backends()
    total = 0
    for path, length, header, spans, data_size in zip(files, lengths, headers, tensors, data_sizes):
        expected = path.read_bytes()
        got = length.tobytes() + header.tobytes() + b"".join(buffer.tobytes() for _, buffer in spans)
        if sum(buffer.nbytes for _, buffer in spans) != data_size:
            raise LaneError(f"{path.name}: the tensors' spans cover {sum(b.nbytes for _, b in spans)} of {data_size} bytes")
        if got != expected:
            at = next(i for i, (x, y) in enumerate(zip(got, expected)) if x != y) if len(got) == len(expected) else -1
            raise LaneError(f"{path.name}: the streamed bytes differ from the file (first at byte {at})")
        total += len(got)
    return {
        "bytes": total,
        "wall_s": wall,
        "user_s": usage1.ru_utime - usage0.ru_utime,
        "sys_s": usage1.ru_stime - usage0.ru_stime,
        "machine_cpu_s": (busy1 - busy0) / os.sysconf("SC_CLK_TCK"),
        "backends": backends,
    }


# --- the parent: runs streams, reads the gateway's metrics -------------------


@dataclass
class GatewayCounts:
    """The gateway's GetObject counters (its /metrics): requests and payload
    bytes, by RDMA and by HTTP."""

    rdma_requests: float = 0.0
    rdma_bytes: float = 0.0
    http_requests: float = 0.0
    http_bytes: float = 0.0

    @staticmethod
    def read(url: str) -> GatewayCounts:
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        counts = GatewayCounts()
        line_re = re.compile(r"^(hipobj_s3_(?:requests|bytes)_total)\{([^}]*)\}\s+(\S+)")
        for line in text.splitlines():
            m = line_re.match(line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            if labels.get("op") != "GetObject" or labels.get("path") not in ("rdma", "http"):
                continue
            kind = "requests" if m.group(1) == "hipobj_s3_requests_total" else "bytes"
            name = f"{labels['path']}_{kind}"
            setattr(counts, name, getattr(counts, name) + float(m.group(3)))
        return counts

    def __sub__(self, other: GatewayCounts) -> GatewayCounts:
        return GatewayCounts(
            self.rdma_requests - other.rdma_requests,
            self.rdma_bytes - other.rdma_bytes,
            self.http_requests - other.http_requests,
            self.http_bytes - other.http_bytes,
        )


@dataclass
class Run:
    """One stream's figures, as its process and the gateway saw them."""

    backend: str
    bytes: int
    wall_s: float
    cpu_s: float
    user_s: float
    sys_s: float
    machine_cpu_s: float
    gateway: GatewayCounts
    # Our backend's own counters (its HIPOBJ_STREAMER_STATS file); None for
    # the stock backend.
    counters: dict[str, object] | None


def run_stream(backend: str, uris: list[str], files: list[Path]) -> Run:
    """Runs one stream in a child process with BACKEND ("ours" or "stock")
    loaded, and checks what it says: the bytes (the child checks them), the
    backend mapped, and the gateway's counts of how the bytes went."""
    site = os.environ["HIPOBJ_STREAMER_SITE"]
    ours_dir = os.environ["HIPOBJ_STREAMER_OURS"]
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    wheel_backend = os.path.realpath(f"{site}/runai_model_streamer/libstreamer/lib/libstreamers3.so")
    ours = os.path.realpath(f"{ours_dir}/libstreamers3.so")
    stats = Path(tempfile.mkdtemp(prefix="hipobj-streamer-stats-")) / "stats.json"
    if backend == "ours":
        env["LD_LIBRARY_PATH"] = ours_dir
        # Our backend writes its counters there when its clients are removed
        # (at the stream's end).
        env["HIPOBJ_STREAMER_STATS"] = str(stats)
        expected = ours
    else:
        expected = wheel_backend
    if not os.path.isfile(expected):
        raise LaneError(f"no {backend} backend at {expected}")
    metrics = os.environ["HIPOBJ_STREAMER_METRICS"]
    before = GatewayCounts.read(metrics)
    child = subprocess.run(
        [sys.executable, __file__, "stream", *[f"{u}={f}" for u, f in zip(uris, files)]],
        env=env, capture_output=True, text=True, check=False,
    )
    after = GatewayCounts.read(metrics)
    if child.returncode != 0:
        raise LaneError(f"the stream by the {backend} backend failed (status {child.returncode}):\n{child.stderr[-4000:]}")
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    counters = json.loads(stats.read_text()) if backend == "ours" and stats.is_file() else None
    if stats.is_file():
        stats.unlink()
    stats.parent.rmdir()
    if figures["backends"] != [expected]:
        raise LaneError(f"the {backend} stream mapped {figures['backends']}, not {expected}")
    return Run(
        backend=backend,
        bytes=figures["bytes"],
        wall_s=figures["wall_s"],
        cpu_s=figures["user_s"] + figures["sys_s"],
        user_s=figures["user_s"],
        sys_s=figures["sys_s"],
        machine_cpu_s=figures["machine_cpu_s"],
        gateway=after - before,
        counters=counters,
    )


def check_path(run: Run) -> None:
    """How the bytes went. Ours: by RDMA, every byte, by its own counters
    (no read over HTTP, none failed, no registration left after the
    stream's end) and by the gateway's (every byte in
    RDMA GETs, a read tried again may count twice; no GET answered over
    HTTP). The stock backend: by HTTP only (which it may also try again)."""
    g = run.gateway
    if run.backend == "ours":
        c = run.counters
        if c is None:
            raise LaneError("our backend wrote no counters (HIPOBJ_STREAMER_STATS): was it loaded?")
        if c.get("rdma_bytes") != run.bytes or c.get("http_reads") != 0 or c.get("failed_reads") != 0:
            raise LaneError(
                f"ours streamed {run.bytes} bytes but counts {c.get('rdma_bytes')} bytes in "
                f"{c.get('rdma_reads')} reads by RDMA, {c.get('http_bytes')} bytes in {c.get('http_reads')} "
                f"reads over HTTP (why: {c.get('fallback_reasons')}), {c.get('failed_reads')} failed: "
                "RDMA did not carry every byte"
            )
        if c.get("registered_buffers") != 0:
            raise LaneError(f"ours still holds {c.get('registered_buffers')} registrations after the stream's end")
        if g.rdma_bytes < run.bytes or g.http_requests != 0 or g.http_bytes != 0:
            raise LaneError(
                f"ours streamed {run.bytes} bytes but the gateway counts {g.rdma_bytes:.0f} bytes in "
                f"{g.rdma_requests:.0f} RDMA GETs and {g.http_bytes:.0f} bytes in {g.http_requests:.0f} "
                "HTTP GETs: RDMA did not carry every byte"
            )
    elif g.rdma_requests != 0 or g.http_bytes < run.bytes:
        raise LaneError(
            f"the stock backend streamed {run.bytes} bytes but the gateway counts {g.http_bytes:.0f} "
            f"bytes over HTTP and {g.rdma_requests:.0f} RDMA GETs"
        )


def describe(run: Run) -> str:
    g = run.gateway
    c = run.counters
    ours = f"; ours: {c.get('rdma_reads')} reads by RDMA, {c.get('http_reads')} over HTTP" if c else ""
    return (
        f"{run.backend:5s} {run.bytes / MIB:7.1f} MiB in {run.wall_s:6.2f} s "
        f"({run.bytes / MIB / run.wall_s:6.1f} MiB/s), CPU {run.cpu_s:6.2f} s "
        f"(user {run.user_s:.2f}, sys {run.sys_s:.2f}; {run.cpu_s / (run.bytes / GIB):6.2f} s/GiB), "
        f"machine CPU {run.machine_cpu_s:6.2f} s; gateway: {g.rdma_requests:.0f} RDMA GETs "
        f"({g.rdma_bytes / MIB:.1f} MiB), {g.http_requests:.0f} HTTP GETs ({g.http_bytes / MIB:.1f} MiB){ours}"
    )


def prepare(args: argparse.Namespace, work: Path) -> tuple[list[str], list[Path]]:
    start = time.perf_counter()
    files = make_model(work, args.shards, args.shard_mib)
    written = time.perf_counter()
    uris = upload(files, os.environ["HIPOBJ_GARAGE_BUCKET"], "streamer-model")
    size = sum(f.stat().st_size for f in files)
    print(
        f"streamer-lane: model of {len(files)} shards, {size / MIB:.1f} MiB, written in "
        f"{written - start:.1f} s, put into Garage in {time.perf_counter() - written:.1f} s",
        flush=True,
    )
    return uris, files


def check(args: argparse.Namespace, work: Path) -> None:
    uris, files = prepare(args, work)
    run = run_stream("ours", uris, files)
    print(f"streamer-lane: {describe(run)}", flush=True)
    check_path(run)
    print("streamer-lane: byte-exact, every byte by RDMA, through our libstreamers3.so", flush=True)


def bench(args: argparse.Namespace, work: Path) -> None:
    uris, files = prepare(args, work)
    runs: dict[str, list[Run]] = {"stock": [], "ours": []}
    # A warm-up each (the gateway's connections to Garage, the page cache),
    # not counted; then the two in turn, which goes first alternating by
    # round (from round 1 on), so that a drift of the machine weighs on both alike.
    for round_ in range(-1, args.rounds):
        order = ["stock", "ours"] if round_ <= 0 or round_ % 2 == 0 else ["ours", "stock"]
        for backend in order:
            run = run_stream(backend, uris, files)
            check_path(run)
            print(f"streamer-lane: round {round_ + 1}{' (warm-up)' if round_ < 0 else ''}: {describe(run)}", flush=True)
            if round_ >= 0:
                runs[backend].append(run)
    size = runs["ours"][0].bytes
    print()
    print(f"The model: {len(files)} shards, {size / MIB:.1f} MiB; {args.rounds} streams each, medians (range)")
    print()
    print("| backend | path | MiB/s | CPU s per GiB (user + sys) | machine CPU s per GiB |")
    print("|---|---|---|---|---|")
    medians: dict[str, tuple[float, float]] = {}
    for backend, path in (("stock", "HTTP"), ("ours", "RDMA")):
        rates = [r.bytes / MIB / r.wall_s for r in runs[backend]]
        cpus = [r.cpu_s / (r.bytes / GIB) for r in runs[backend]]
        machine = [r.machine_cpu_s / (r.bytes / GIB) for r in runs[backend]]
        medians[backend] = (statistics.median(rates), statistics.median(cpus))
        print(
            f"| {backend} | {path} | {statistics.median(rates):.1f} ({min(rates):.1f} to {max(rates):.1f}) "
            f"| {statistics.median(cpus):.2f} ({min(cpus):.2f} to {max(cpus):.2f}) "
            f"| {statistics.median(machine):.2f} ({min(machine):.2f} to {max(machine):.2f}) |"
        )
    print()
    print(
        f"ours / stock: throughput {medians['ours'][0] / medians['stock'][0]:.2f} (goal at least 1), "
        f"CPU per GiB {medians['ours'][1] / medians['stock'][1]:.2f} (goal at most 0.5)"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "stream":
        pairs = [a.split("=", 1) for a in sys.argv[2:]]
        print(json.dumps(stream([u for u, _ in pairs], [Path(f) for _, f in pairs])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["check", "bench"])
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--shard-mib", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hipobj-streamer-") as work:
        try:
            (check if args.mode == "check" else bench)(args, Path(work))
        except LaneError as error:
            print(f"streamer-lane: FAILED: {error}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
