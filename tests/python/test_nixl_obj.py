"""NIXL's stock ``OBJ`` backend, as published on PyPI (``nixl-cu12`` 1.5.1,
no GPU, no UCX), against ``hipobj-s3-server``: the plug point vLLM's
object-store KV tier, LMCache's ``nixl_backend``, Dynamo's KVBM and
SGLang's HiCache use for object storage. Nothing on NIXL's side is changed
or mocked: the plugin is an S3 HTTP client (the AWS C++ SDK) told where the
gateway is through its backend parameters.

Three servers run for the whole module, each a ``hipobj-s3-server``
process started from ``HIPOBJ_S3_SERVER`` (``scripts/nixl-test.sh`` builds
it and sets it):

- ``local``: the gateway over a directory (``--root``), as deployed: RDMA
  is not turned off, it is simply never asked for (the plugin sends no
  ``x-amz-rdma-token``; on a host without a device it is off anyway);
- ``store``: a second one over a directory (``--no-rdma``), playing the S3
  store that ``upstream`` fronts;
- ``upstream``: the gateway in front of it (``--upstream``), holding no
  object of its own.

The store is a second ``hipobj-s3-server`` because it is the cheapest real
S3 server at hand (built already, starts in milliseconds, its objects are
files to compare): what is tested here is NIXL against the gateway's
upstream backend, and that backend against other stores (SeaweedFS,
Garage) is their lanes' work (``scripts/seaweedfs-test.sh``,
``scripts/garage-test.sh``).

NIXL is pointed at ``local`` or at ``upstream`` (the ``target`` fixture),
and every test checks bytes where they land: in the object's file under
the serving root (the store's, behind the upstream gateway) and in the
host buffer a READ fills. Each test also reads the gateways' own account
of what arrived (``hipobj_s3_requests_total`` from ``--metrics-listen``,
and the one line the gateway logs per answer of 400 or more), so that no
test can pass against a server that saw nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

# nixl-cu12 only: the meta package ``nixl`` would pick ``nixl_cu13``
# where it finds no CUDA, whose OBJ plugin needs NVIDIA's cuObject.
from nixl_cu12._api import nixl_agent, nixl_agent_config
from nixl_cu12._bindings import nixlBackendError, nixlNotFoundError

BUCKET = "nixl-kv"
REGION = "us-east-1"
MIB = 1 << 20
# What NIXL's CRT engine needs at least (smaller values are raised to it).
CRT_MIN_LIMIT = 5 * MIB
# How long one transfer may take before the test calls it hung.
TRANSFER_TIMEOUT_S = 60.0
# How long a server may take to print where it listens.
START_TIMEOUT_S = 20.0

Requests = collections.Counter  # (op, status) -> requests answered

_LISTENING = re.compile(r"hipobj-s3-server listening on (http://\S+) ")
_METRICS = re.compile(r"hipobj-s3-server metrics on (http://\S+/metrics)")
_REQUESTS = re.compile(
    r'^hipobj_s3_requests_total\{path="(?P<path>[^"]*)",op="(?P<op>[^"]*)",'
    r'status="(?P<status>[^"]*)"\} (?P<value>[0-9.e+]+)$',
    re.MULTILINE,
)


# --------------------------------------------------------------------------
# The servers


def _die_with_parent() -> list[str]:
    """What each server's command starts with: util-linux's ``setpriv``
    sets its parent-death signal before it execs the server, so that the
    server gets SIGTERM should the test process die without stopping it
    (no ``preexec_fn``: forking a threaded process to run Python is not
    safe). Without ``setpriv``, the fixture's teardown alone stops them."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


@dataclasses.dataclass
class Gateway:
    """One ``hipobj-s3-server`` process, its addresses and its log."""

    name: str
    process: subprocess.Popen[bytes]
    endpoint: str
    metrics_url: str
    log_path: pathlib.Path

    @classmethod
    def start(
        cls,
        name: str,
        binary: str,
        work: pathlib.Path,
        args: list[str],
        env: dict[str, str] | None = None,
    ) -> Gateway:
        """Starts the server with ``args`` (and the listeners on free
        ports), and waits until it says where it listens."""
        out_path = work / f"{name}.out"
        log_path = work / f"{name}.log"
        command = [
            *_die_with_parent(),
            binary,
            *args,
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--region",
            REGION,
        ]
        with open(out_path, "wb") as out, open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            said = out_path.read_text()
            listening, metrics = _LISTENING.search(said), _METRICS.search(said)
            if listening and metrics:
                return cls(name, process, listening.group(1), metrics.group(1), log_path)
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                pytest.fail(
                    f"{name}: {' '.join(command)} did not start "
                    f"(exit {process.returncode}):\n{said}{log_path.read_text()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then the exit status must be 0 within 15 s."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"{self.name} did not stop on SIGTERM within 15 s")
        assert code == 0, f"{self.name} exited with {code}:\n{self.log()}"

    def requests(self) -> Requests:
        """The answers it has sent so far, by (S3 operation, HTTP status),
        from its Prometheus metrics. Every one went by HTTP: NIXL's plugin
        never asks for RDMA."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        counts: Requests = collections.Counter()
        for match in _REQUESTS.finditer(text):
            assert match["path"] == "http", f"{self.name}: {match.group(0)}"
            counts[(match["op"], match["status"])] += int(float(match["value"]))
        return counts

    def log(self) -> str:
        """What it wrote to standard error so far."""
        return self.log_path.read_text()


@dataclasses.dataclass
class Target:
    """A gateway NIXL is pointed at, and where its objects' bytes land."""

    name: str
    gateway: Gateway
    # The store behind the gateway (for ``upstream``), which must have
    # seen the same operations.
    store: Gateway | None
    # The directory whose files are the bucket's objects.
    objects: pathlib.Path
    access_key: str
    secret_key: str

    def params(self, **extra: str) -> dict[str, str]:
        """The OBJ backend's parameters for this gateway (``docs/ml.md``):
        every value a string."""
        return {
            "endpoint_override": self.gateway.endpoint,
            "bucket": BUCKET,
            "scheme": "http",
            "region": REGION,
            "use_virtual_addressing": "false",
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            **extra,
        }

    def stored(self, key: str) -> bytes | None:
        """The object's bytes as the serving root holds them (the local
        backend keeps an object as the file ``ROOT/BUCKET/KEY``), or None."""
        path = self.objects / key
        return path.read_bytes() if path.is_file() else None

    def requests(self) -> list[Requests]:
        """The gateway's counts, then the store's behind it, if any."""
        return [g.requests() for g in self.gateways()]

    def gateways(self) -> list[Gateway]:
        """The gateway, then the store behind it, if any."""
        return [self.gateway] + ([self.store] if self.store else [])

    def since(self, before: list[Requests]) -> Requests:
        """The requests answered since ``before`` (from :meth:`requests`),
        by the gateway; for ``upstream``, the store must have answered
        the same operations with the same statuses."""
        now = self.requests()
        deltas = [after - earlier for after, earlier in zip(now, before, strict=True)]
        for store_delta in deltas[1:]:
            assert store_delta == deltas[0], (
                f"the gateway answered {dict(deltas[0])}, the store behind it {dict(store_delta)}"
            )
        return deltas[0]


def _secret_file(path: pathlib.Path, secret: str) -> pathlib.Path:
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    binary = os.environ.get("HIPOBJ_S3_SERVER", "")
    if not (binary and os.access(binary, os.X_OK)):
        pytest.fail(
            "HIPOBJ_S3_SERVER must name a built hipobj-s3-server "
            f"(got {binary!r}): run scripts/nixl-test.sh, which builds and sets it"
        )
    work = tmp_path_factory.mktemp("servers")
    started: list[Gateway] = []
    try:
        local_root = work / "local-root"
        local = Gateway.start(
            "local",
            binary,
            work,
            [
                "--root",
                str(local_root),
                "--bucket",
                BUCKET,
                "--access-key",
                "NIXLLOCALKEY",
                "--secret-key-file",
                str(_secret_file(work / "local.secret", "local-secret-1")),
            ],
        )
        started.append(local)
        store_root = work / "store-root"
        store = Gateway.start(
            "store",
            binary,
            work,
            [
                "--root",
                str(store_root),
                "--bucket",
                BUCKET,
                "--no-rdma",
                "--access-key",
                "STOREKEY",
                "--secret-key-file",
                str(_secret_file(work / "store.secret", "store-secret-2")),
            ],
        )
        started.append(store)
        # The upstream gateway signs for the store with the AWS variables,
        # as any S3 tool would, and with no shared files to find.
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "AWS_ACCESS_KEY_ID": "STOREKEY",
            "AWS_SECRET_ACCESS_KEY": "store-secret-2",
            "AWS_CONFIG_FILE": str(work / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-aws-credentials"),
        }
        upstream = Gateway.start(
            "upstream",
            binary,
            work,
            [
                "--upstream",
                store.endpoint,
                "--access-key",
                "NIXLUPSTREAMKEY",
                "--secret-key-file",
                str(_secret_file(work / "upstream.secret", "upstream-secret-3")),
            ],
            env=env,
        )
        started.append(upstream)
        yield {
            "local": Target(
                "local", local, None, local_root / BUCKET, "NIXLLOCALKEY", "local-secret-1"
            ),
            "upstream": Target(
                "upstream",
                upstream,
                store,
                store_root / BUCKET,
                "NIXLUPSTREAMKEY",
                "upstream-secret-3",
            ),
        }
    finally:
        # The gateway first, then what it stands in front of.
        for gateway in reversed(started):
            gateway.stop()


@pytest.fixture(params=["local", "upstream"])
def target(request: pytest.FixtureRequest, servers: dict[str, Target]) -> Target:
    """Each test that takes it runs against both backends."""
    return servers[request.param]


@pytest.fixture
def local(servers: dict[str, Target]) -> Target:
    """For what happens in NIXL before a request is sent: one backend is
    enough."""
    return servers["local"]


@pytest.fixture(autouse=True)
def _aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK inside the plugin reads these: none of them may point it
    elsewhere than the parameters do."""
    for name in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_BUCKET", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------
# NIXL, driven as its consumers drive it

_agent_names = itertools.count()


class ObjAgent:
    """A NIXL agent with the OBJ backend only, and the calls every test
    makes (the sequence of docs/ml.md)."""

    def __init__(self, params: dict[str, str]) -> None:
        self.name = f"hipobj-nixl-test-{next(_agent_names)}"
        # No backend at start: no UCX.
        self.agent = nixl_agent(self.name, nixl_agent_config(backends=[]))
        self.agent.create_backend("OBJ", params)
        self._dev_ids = itertools.count(1)

    def buffers(self, *arrays: np.ndarray) -> None:
        """Registers host buffers (DRAM) with the backend."""
        self.agent.register_memory(
            [(a.ctypes.data, a.nbytes, 0, "") for a in arrays],
            mem_type="DRAM",
            backends=["OBJ"],
        )

    def objects(self, *objects: tuple[str, int]) -> list[int]:
        """Registers objects by (key, size), and returns the device ids
        transfers name them by. The size bounds what may be transferred."""
        ids = [next(self._dev_ids) for _ in objects]
        reg = self.agent.get_reg_descs(
            [(0, size, dev, key) for dev, (key, size) in zip(ids, objects, strict=True)], "OBJ"
        )
        self.agent.register_memory(reg, backends=["OBJ"])
        return ids

    def query(self, *objects: tuple[int, str, int]) -> list[dict | None]:
        """``query_memory`` for (dev_id, key, size) entries."""
        return self.agent.query_memory(
            [(0, size, dev, key) for dev, key, size in objects], "OBJ", mem_type="OBJ"
        )

    def prepare(self, op: str, pairs: list[tuple[np.ndarray, int, int]]) -> object:
        """``initialize_xfer`` for (host view, dev_id, offset in the
        object) pairs: each view's bytes to or from that much of the
        object."""
        local = self.agent.get_xfer_descs(
            [(view.ctypes.data, view.nbytes, 0) for view, _, _ in pairs], mem_type="DRAM"
        )
        remote = self.agent.get_xfer_descs(
            [(offset, view.nbytes, dev) for view, dev, offset in pairs], "OBJ"
        )
        return self.agent.initialize_xfer(op, local, remote, self.name, backends=["OBJ"])

    def wait(self, handle: object, state: str) -> None:
        """Polls ``check_xfer_state`` from ``state`` until DONE; a backend
        failure is raised by the poll itself."""
        deadline = time.monotonic() + TRANSFER_TIMEOUT_S
        while state != "DONE":
            assert state in ("PROC", "DONE"), f"transfer state {state!r}"
            assert time.monotonic() < deadline, (
                f"transfer still {state} after {TRANSFER_TIMEOUT_S} s"
            )
            time.sleep(0.002)
            state = self.agent.check_xfer_state(handle)

    def xfer(self, op: str, pairs: list[tuple[np.ndarray, int, int]]) -> None:
        """One transfer of ``pairs`` (see :meth:`prepare`), to the end."""
        handle = self.prepare(op, pairs)
        try:
            self.wait(handle, self.agent.transfer(handle))
        finally:
            self.agent.release_xfer_handle(handle)


# What the ``obj`` and ``key`` fixtures give.
MakeAgent = Callable[[dict[str, str]], ObjAgent]
MakeKey = Callable[[str], str]


@pytest.fixture
def obj() -> Iterator[MakeAgent]:
    """Makes agents for a test; they go with it."""
    agents: list[ObjAgent] = []

    def make(params: dict[str, str]) -> ObjAgent:
        agents.append(ObjAgent(params))
        return agents[-1]

    yield make
    agents.clear()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> MakeKey:
    """Object keys no other test uses: ``kv/<test>/<name>-<random>``."""
    test = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)

    def make(name: str) -> str:
        return f"kv/{test}/{name}-{uuid.uuid4().hex[:8]}"

    return make


def random_bytes(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


# --------------------------------------------------------------------------
# Transfers


def test_write_then_read_is_byte_exact(target: Target, obj: MakeAgent, key: MakeKey) -> None:
    data = random_bytes(MIB, seed=1)
    back = np.zeros(MIB, dtype=np.uint8)
    agent = obj(target.params())
    agent.buffers(data, back)
    name = key("whole")
    (dev,) = agent.objects((name, MIB))

    before = target.requests()
    agent.xfer("WRITE", [(data, dev, 0)])
    assert target.stored(name) == data.tobytes()
    agent.xfer("READ", [(back, dev, 0)])
    assert np.array_equal(back, data)

    # Even a READ of the whole object is a ranged GET.
    assert target.since(before) == Requests({("PutObject", "200"): 1, ("GetObject", "206"): 1})


def test_ranged_reads_at_offsets(target: Target, obj: MakeAgent, key: MakeKey) -> None:
    size = MIB + 12345
    data = random_bytes(size, seed=2)
    agent = obj(target.params())
    # One destination with guard bytes either side of each range: a READ
    # writes its range and nothing else.
    guard = 64
    dest = np.full(2 * guard + 8192, 0xA5, dtype=np.uint8)
    agent.buffers(data, dest)
    name = key("ranged")
    (dev,) = agent.objects((name, size))
    agent.xfer("WRITE", [(data, dev, 0)])

    before = target.requests()
    for offset, length in [(1000, 4096), (size - 777, 777), (0, 1), (MIB, 8192)]:
        dest[:] = 0xA5
        agent.xfer("READ", [(dest[guard : guard + length], dev, offset)])
        assert np.array_equal(dest[guard : guard + length], data[offset : offset + length]), (
            offset,
            length,
        )
        assert (dest[:guard] == 0xA5).all() and (dest[guard + length :] == 0xA5).all()
    arrived = target.since(before)
    assert arrived == Requests({("GetObject", "206"): 4}), arrived


def test_several_descriptors_in_one_transfer(target: Target, obj: MakeAgent, key: MakeKey) -> None:
    sizes = [64 * 1024, MIB, 300 * 1024 + 7]
    datas = [random_bytes(size, seed=10 + i) for i, size in enumerate(sizes)]
    agent = obj(target.params())
    # Everything read back lands in one buffer, each piece at its place.
    piece = 4096
    back = np.zeros(sum(sizes) + piece, dtype=np.uint8)
    agent.buffers(*datas, back)
    names = [key(f"part{i}") for i in range(len(sizes))]
    devs = agent.objects(*zip(names, sizes, strict=True))

    before = target.requests()
    agent.xfer("WRITE", [(data, dev, 0) for data, dev in zip(datas, devs, strict=True)])
    for name, data in zip(names, datas, strict=True):
        assert target.stored(name) == data.tobytes()
    assert target.since(before) == Requests({("PutObject", "200"): 3})

    before = target.requests()
    starts = np.cumsum([0] + sizes)
    pairs = [(back[starts[i] : starts[i + 1]], dev, 0) for i, dev in enumerate(devs)]
    # And a fourth pair: a range from the middle of the second object.
    pairs.append((back[starts[-1] :], devs[1], 5000))
    agent.xfer("READ", pairs)
    for i, data in enumerate(datas):
        assert np.array_equal(back[starts[i] : starts[i + 1]], data), i
    assert np.array_equal(back[starts[-1] :], datas[1][5000 : 5000 + piece])
    assert target.since(before) == Requests({("GetObject", "206"): 4})


def test_crt_client_above_its_limit_standard_client_below(
    target: Target, obj: MakeAgent, key: MakeKey
) -> None:
    """``crtMinLimit``: objects of that size or more go through the CRT
    client (a multipart upload, and GETs of parts), smaller ones through
    the standard client (one PUT, one GET)."""
    big_size, small_size = 32 * MIB, MIB
    big, small = random_bytes(big_size, seed=20), random_bytes(small_size, seed=21)
    big_back, small_back = np.zeros_like(big), np.zeros_like(small)
    agent = obj(target.params(crtMinLimit=str(CRT_MIN_LIMIT)))
    agent.buffers(big, small, big_back, small_back)
    big_name, small_name = key("big"), key("small")
    big_dev, small_dev = agent.objects((big_name, big_size), (small_name, small_size))

    before = target.requests()
    agent.xfer("WRITE", [(big, big_dev, 0)])
    assert target.stored(big_name) == big.tobytes()
    arrived = target.since(before)
    assert arrived[("CreateMultipartUpload", "200")] == 1, arrived
    assert arrived[("UploadPart", "200")] >= 2, arrived
    assert arrived[("CompleteMultipartUpload", "200")] == 1, arrived
    assert arrived[("PutObject", "200")] == 0, arrived

    before = target.requests()
    agent.xfer("READ", [(big_back, big_dev, 0)])
    assert np.array_equal(big_back, big)
    arrived = target.since(before)
    assert arrived[("GetObject", "206")] >= 2, arrived
    assert set(arrived) == {("GetObject", "206")}, arrived

    before = target.requests()
    agent.xfer("WRITE", [(small, small_dev, 0)])
    agent.xfer("READ", [(small_back, small_dev, 0)])
    assert target.stored(small_name) == small.tobytes()
    assert np.array_equal(small_back, small)
    arrived = target.since(before)
    assert arrived[("PutObject", "200")] == 1, arrived
    assert arrived[("GetObject", "206")] == 1, arrived
    assert arrived[("UploadPart", "200")] == 0, arrived


@pytest.mark.parametrize("req_checksum", ["required", "supported"])
@pytest.mark.parametrize("resp_checksum", ["required", "supported"])
def test_checksum_modes(
    target: Target, obj: MakeAgent, key: MakeKey, req_checksum: str, resp_checksum: str
) -> None:
    """With ``supported`` the SDK adds checksums to every request it can
    (a PUT's body goes aws-chunked, the CRC in a trailer) and asks for
    them back: the object stored must be the payload, not its framing."""
    size = 3 * MIB + 5
    data = random_bytes(size, seed=30)
    back = np.zeros(size, dtype=np.uint8)
    agent = obj(target.params(req_checksum=req_checksum, resp_checksum=resp_checksum))
    agent.buffers(data, back)
    name = key("sum")
    (dev,) = agent.objects((name, size))
    before = target.requests()
    agent.xfer("WRITE", [(data, dev, 0)])
    assert target.stored(name) == data.tobytes()
    agent.xfer("READ", [(back, dev, 0)])
    assert np.array_equal(back, data)
    arrived = target.since(before)
    assert arrived[("PutObject", "200")] == 1, arrived
    assert arrived[("GetObject", "206")] == 1, arrived


def test_endpoint_without_scheme_takes_the_scheme_parameter(
    local: Target, obj: MakeAgent, key: MakeKey
) -> None:
    """``host:port`` and ``scheme=http``: the default scheme, https, would
    fail here (after the SDK's retries, 11 attempts over about 25 s, each
    logged by the gateway as "invalid HTTP method parsed")."""
    data = random_bytes(4096, seed=40)
    host_port = local.gateway.endpoint.removeprefix("http://")
    agent = obj(local.params(endpoint_override=host_port, scheme="http"))
    agent.buffers(data)
    name = key("plain")
    (dev,) = agent.objects((name, data.nbytes))
    before = local.requests()
    agent.xfer("WRITE", [(data, dev, 0)])
    assert local.stored(name) == data.tobytes()
    assert local.since(before) == Requests({("PutObject", "200"): 1})


def test_query_memory_present_and_missing(target: Target, obj: MakeAgent, key: MakeKey) -> None:
    data = random_bytes(1000, seed=50)
    agent = obj(target.params())
    agent.buffers(data)
    present, missing = key("present"), key("missing")
    (dev, missing_dev) = agent.objects((present, 1000), (missing, 1000))
    agent.xfer("WRITE", [(data, dev, 0)])

    before = target.requests()
    assert agent.query((dev, present, 1000), (missing_dev, missing, 1000)) == [{}, None]
    assert target.since(before) == Requests({("HeadObject", "200"): 1, ("HeadObject", "404"): 1})
    assert target.stored(missing) is None


# --------------------------------------------------------------------------
# The traps


def test_read_beyond_the_registered_size_fails_at_initialize(
    local: Target, obj: MakeAgent, key: MakeKey
) -> None:
    """The registered size bounds transfers, whatever the object's."""
    data = random_bytes(8192, seed=60)
    back = np.zeros(200, dtype=np.uint8)
    writer = obj(local.params())
    writer.buffers(data)
    name = key("bounded")
    (dev,) = writer.objects((name, 8192))
    writer.xfer("WRITE", [(data, dev, 0)])

    agent = obj(local.params())
    agent.buffers(back)
    (dev,) = agent.objects((name, 4096))
    before = local.requests()
    with pytest.raises(nixlNotFoundError):
        agent.prepare("READ", [(back, dev, 4000)])
    assert local.since(before) == Requests(), "nothing may reach the gateway"
    # Within the registered size, the same object reads.
    agent.xfer("READ", [(back[:96], dev, 4000)])
    assert np.array_equal(back[:96], data[4000:4096])
    assert local.since(before) == Requests({("GetObject", "206"): 1})


def test_write_at_a_nonzero_offset_is_a_backend_error(
    target: Target, obj: MakeAgent, key: MakeKey
) -> None:
    data = random_bytes(4096, seed=70)
    agent = obj(target.params())
    agent.buffers(data)
    name = key("offset")
    (dev,) = agent.objects((name, 8192))
    before = target.requests()
    with pytest.raises(nixlBackendError):
        agent.xfer("WRITE", [(data, dev, 4096)])
    assert target.stored(name) is None
    assert target.since(before) == Requests(), "no request may reach the gateway"
    # At offset 0, the same registration writes the whole object.
    agent.xfer("WRITE", [(data, dev, 0)])
    assert target.stored(name) == data.tobytes()


def test_reading_a_missing_object_raises_from_check_xfer_state(
    target: Target, obj: MakeAgent, key: MakeKey
) -> None:
    dest = np.full(4096, 0xA5, dtype=np.uint8)
    agent = obj(target.params())
    agent.buffers(dest)
    name = key("absent")
    (dev,) = agent.objects((name, 4096))
    before = target.requests()
    handle = agent.prepare("READ", [(dest, dev, 0)])
    try:
        state = agent.agent.transfer(handle)
        assert state in ("PROC", "DONE"), state
        with pytest.raises(nixlBackendError):
            agent.wait(handle, state)
    finally:
        agent.agent.release_xfer_handle(handle)
    # NIXL's standard client reads the error answer's body into the
    # destination: the buffer holds the S3 error document, and only it.
    written = dest.tobytes().rstrip(b"\xa5")
    assert written.startswith(b"<?xml") and b"<Code>NoSuchKey</Code>" in written, written
    print(written.decode())
    assert target.since(before) == Requests({("GetObject", "404"): 1})
    # The cause, with the key, in each server's log: NIXL's exception
    # says only NIXL_ERR_BACKEND.
    for gateway in target.gateways():
        assert re.search(
            rf"GET /{BUCKET}/{re.escape(name)} \(GetObject\) .*: 404 NoSuchKey", gateway.log()
        ), f"{gateway.name}'s log:\n{gateway.log()}"


@pytest.mark.parametrize(
    "wrong, value, status, code",
    [
        ("secret_key", "NOTTHESECRET", "403", "SignatureDoesNotMatch"),
        ("access_key", "NOTTHEKEY", "403", "(InvalidAccessKeyId|NotSignedUp)"),
        # Signed for another region than the gateway's --region.
        ("region", "eu-west-1", "400", "AuthorizationHeaderMalformed"),
    ],
)
def test_wrong_credentials_are_refused(
    target: Target, obj: MakeAgent, key: MakeKey, wrong: str, value: str, status: str, code: str
) -> None:
    data = random_bytes(4096, seed=80)
    params = target.params(**{wrong: value})
    agent = obj(params)
    agent.buffers(data)
    name = key("denied")
    (dev,) = agent.objects((name, 4096))
    before = target.gateway.requests()
    with pytest.raises(nixlBackendError):
        agent.xfer("WRITE", [(data, dev, 0)])
    # query_memory raises too: a refusal is neither "present" nor "missing".
    with pytest.raises(nixlBackendError):
        agent.query((dev, name, 4096))
    assert target.stored(name) is None
    arrived = target.gateway.requests() - before
    assert arrived == Requests({("PutObject", status): 1, ("HeadObject", status): 1}), arrived
    assert re.search(
        rf"PUT /{BUCKET}/{re.escape(name)} \(PutObject\) .* with access key "
        rf"{params['access_key']}: {status} {code}, authentication refused",
        target.gateway.log(),
    ), target.gateway.log()


def test_a_missing_bucket(target: Target, obj: MakeAgent, key: MakeKey) -> None:
    """NIXL creates no bucket: a WRITE fails. But ``query_memory`` answers
    None, as for a missing object: a HEAD's 404 has no body to tell
    NoSuchBucket from NoSuchKey, and only the gateway's log says which."""
    data = random_bytes(4096, seed=85)
    agent = obj(target.params(bucket="nixl-no-such-bucket"))
    agent.buffers(data)
    name = key("nobucket")
    (dev,) = agent.objects((name, 4096))
    before = target.gateway.requests()
    with pytest.raises(nixlBackendError):
        agent.xfer("WRITE", [(data, dev, 0)])
    assert agent.query((dev, name, 4096)) == [None]
    assert not (target.objects.parent / "nixl-no-such-bucket").exists()
    arrived = target.gateway.requests() - before
    assert arrived == Requests({("PutObject", "404"): 1, ("HeadObject", "404"): 1}), arrived
    # In front of a store, the gateway learns of a HEAD's 404 what NIXL
    # does: no more than NotFound.
    head_code = "NoSuchBucket" if target.store is None else "NotFound"
    for method, op, code in [
        ("PUT", "PutObject", "NoSuchBucket"),
        ("HEAD", "HeadObject", head_code),
    ]:
        assert re.search(
            rf"{method} /nixl-no-such-bucket/{re.escape(name)} \({op}\) .*: 404 {code}",
            target.gateway.log(),
        ), target.gateway.log()


# --------------------------------------------------------------------------
# The configuration itself


def test_bucket_from_aws_default_bucket(
    local: Target, obj: MakeAgent, key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``bucket``, the plugin reads ``AWS_DEFAULT_BUCKET``."""
    monkeypatch.setenv("AWS_DEFAULT_BUCKET", BUCKET)
    params = local.params()
    del params["bucket"]
    data = random_bytes(2048, seed=90)
    agent = obj(params)
    agent.buffers(data)
    name = key("envbucket")
    (dev,) = agent.objects((name, data.nbytes))
    before = local.requests()
    agent.xfer("WRITE", [(data, dev, 0)])
    assert local.stored(name) == data.tobytes()
    assert local.since(before) == Requests({("PutObject", "200"): 1})


def test_endpoint_from_aws_endpoint_url(
    local: Target, obj: MakeAgent, key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``endpoint_override``, the SDK's own variable names the
    gateway."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", local.gateway.endpoint)
    params = local.params()
    del params["endpoint_override"]
    data = random_bytes(2048, seed=91)
    agent = obj(params)
    agent.buffers(data)
    name = key("envendpoint")
    (dev,) = agent.objects((name, data.nbytes))
    before = local.requests()
    agent.xfer("WRITE", [(data, dev, 0)])
    assert local.stored(name) == data.tobytes()
    assert local.since(before) == Requests({("PutObject", "200"): 1})


@pytest.mark.parametrize(
    "change",
    [
        {"bucket": None},
        {"scheme": "ftp"},
        {"accelerated": "true"},
        {"req_checksum": "always"},
        {"resp_checksum": "never"},
    ],
    ids=["no-bucket", "scheme", "accelerated", "req_checksum", "resp_checksum"],
)
def test_create_backend_refuses_a_bad_configuration(
    local: Target, change: dict[str, str | None]
) -> None:
    params = {k: v for k, v in {**local.params(), **change}.items() if v is not None}
    agent = nixl_agent(f"hipobj-nixl-bad-{next(_agent_names)}", nixl_agent_config(backends=[]))
    with pytest.raises(nixlBackendError):
        agent.create_backend("OBJ", params)


def test_backend_params_echo_the_secret_key(local: Target, obj: MakeAgent) -> None:
    """NIXL's behaviour, not the gateway's (docs/ml.md warns of it): what
    ``get_backend_params`` returns must not be logged."""
    agent = obj(local.params())
    assert agent.agent.get_backend_params("OBJ")["secret_key"] == local.secret_key
