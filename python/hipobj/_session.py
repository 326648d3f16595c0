"""The library's one instance in this process, its registrations, and
transfers through a boto3 client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import _buffers, _checksums, _gpu, _lib, _nics, _registry

TOKEN_HEADER = "x-amz-rdma-token"
REPLY_HEADER = "x-amz-rdma-reply"
BYTES_HEADER = "x-amz-rdma-bytes-transferred"

#: The smallest part of a multipart upload but the last (S3's rule).
MIN_PART = 5 << 20


class HipObjError(RuntimeError):
    """A libhipobj call failed: ``code`` is its ``hipObjOpError_t`` name."""

    def __init__(self, call: str, code: int, hip_error: int = 0, detail: str = "") -> None:
        self.call = call
        self.code = _lib.error_name(code)
        self.hip_error = hip_error
        text = f"{call}: {self.code}"
        if hip_error:
            text += f" (hipError {hip_error})"
        if detail:
            text += f": {detail}"
        super().__init__(text)


class TransferError(RuntimeError):
    """A transfer that did not complete: by RDMA, and (where allowed) not
    over plain HTTP either. The message names the operation, the bucket and
    key, and the endpoint, then why. ``reply`` is the server's
    ``x-amz-rdma-reply``, ``cause`` what the S3 client raised (botocore's
    exception), if anything; ``s3_code`` and ``http_status`` the S3 error's
    code and status, where the server answered with one."""

    def __init__(
        self,
        message: str,
        reply: Optional[str] = None,
        cause: Optional[BaseException] = None,
        s3_code: Optional[str] = None,
        http_status: Optional[int] = None,
    ):
        super().__init__(message)
        self.reply = reply
        self.cause = cause
        self.s3_code = s3_code
        self.http_status = http_status


class ObjectChangedError(TransferError):
    """A GET pinned to a version (``IfMatch``) that met another: an answer
    with another ETag, or the server's 412 PreconditionFailed. The message
    names the request (bucket and key) and both versions; ``expected`` is
    the ETag asked for, ``found`` the answer's (``None`` for a 412)."""

    def __init__(self, what: str, expected: str, found: Optional[str], cause: Optional[BaseException] = None):
        now = f"now {found}" if found is not None else "and the server says it no longer is: 412 PreconditionFailed"
        super().__init__(
            f"{what}: the object changed during the transfer (its ETag was {expected}, {now})",
            cause=cause,
            s3_code="PreconditionFailed" if found is None else None,
            http_status=412 if found is None else None,
        )
        self.expected = expected
        self.found = found


class _Cancelled(TransferError):
    """A transfer whose asyncio task was cancelled before its request left
    (or, for a GET that fell back, before its body landed): nothing moved
    after the cancel."""


@dataclass(frozen=True)
class Transfer:
    """What a transfer did."""

    #: ``"rdma"`` or ``"fallback"`` (plain HTTP).
    path: str
    #: Bytes moved.
    bytes: int
    #: Why the fallback was taken, if it was.
    reason: Optional[str] = None
    #: Parts of a multipart upload (0 otherwise).
    parts: int = 0
    #: Whether its bytes were checked: a GET's compared with the server's
    #: CRC-64/NVME, a PUT's sent with theirs for the server to compare.
    verified: bool = False
    #: Why they were not, if they were not.
    unverified: Optional[str] = None


#: Why a transfer of GPU memory is not verified.
GPU_UNVERIFIED = "GPU memory is not verified (the client cannot read it without a copy)"
#: Why a transfer with ``verify=False`` is not.
OFF_UNVERIFIED = "verify=False"


@dataclass
class Stats:
    """What moved the bytes in this session."""

    rdma: int = 0
    rdma_bytes: int = 0
    fallback: int = 0
    fallback_bytes: int = 0
    failed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, t: Transfer) -> None:
        with self._lock:
            if t.path == "rdma":
                self.rdma += 1
                self.rdma_bytes += t.bytes
            else:
                self.fallback += 1
                self.fallback_bytes += t.bytes

    def fail(self) -> None:
        with self._lock:
            self.failed += 1


# ---------------------------------------------------------------- the active session

#: The session opened last and not closed: what the module's functions use.
_active: Optional["Session"] = None
_default_lock = threading.Lock()
#: Every session alive, for the fork handler.
_sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """``os.register_at_fork``'s child handler: the child has only the
    forking thread, so every lock another thread held stays held, and the
    library's instance (its driver thread, its connections) is the
    parent's. Fresh locks, and each session forgets the parent's instance
    and registrations without a call into the library."""
    global _default_lock
    _default_lock = threading.Lock()
    _lib.after_fork_in_child()
    _gpu.after_fork_in_child()
    for session in list(_sessions):
        session._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def active() -> "Session":
    """The session opened last and not yet closed; else a new one with the
    defaults (``Session()``: the current GPU, any NIC; host memory on the
    NICs with an active port where there is no GPU; the fallback where
    the library cannot initialize), closed when the process exits."""
    with _default_lock:
        if _active is not None:
            return _active
        import atexit

        session = Session()
        atexit.register(session.close)
        return session


# ---------------------------------------------------------------- boto3

_current = threading.local()


def _cancelled() -> bool:
    """Whether the asyncio task of this thread's transfer was cancelled
    (``Session.aget_object``, ``aput_object``)."""
    cancel = getattr(_current, "cancel", None)
    return cancel is not None and cancel.is_set()


def _within(cancel: Optional[threading.Event], fn: Callable[..., Transfer], *args: Any, **kwargs: Any) -> Transfer:
    """`fn(*args, **kwargs)` on this thread with `cancel` as its transfer's
    cancel flag, which the requests it sends check before they leave."""
    _current.cancel = cancel
    try:
        return fn(*args, **kwargs)
    finally:
        _current.cancel = None


def _add_token(request: Any, **_: Any) -> None:
    """botocore's ``before-sign``: a request of a transfer whose asyncio
    task was cancelled goes no further (the last moment before it leaves);
    else the token of this thread's transfer, if one is under way, goes
    into the request, where SigV4 signs it."""
    if _cancelled():
        raise _Cancelled("its task was cancelled: the request was not sent")
    token = getattr(_current, "token", None)
    if token is None:
        return
    # botocore's headers append on assignment: a second run of this hook
    # (registered again under another id) must not add a second token,
    # which SigV4 would sign as "token,token" and no server matches.
    del request.headers[TOKEN_HEADER]
    request.headers[TOKEN_HEADER] = token


def _rdma_checksums(params: Dict[str, Any], **_: Any) -> None:
    """botocore's ``before-call``, for a request that carries a token:
    botocore computes no checksum of its empty body (it would describe no
    byte the server READs: the session sends the payload's own as
    ``ChecksumCRC64NVME``, or none), and a GET asks for the server's CRC
    (``x-amz-checksum-mode``) only when the session will compare it."""
    if getattr(_current, "token", None) is None:
        return
    context = params.get("context", {}).get("checksum")
    if isinstance(context, dict):
        context.pop("request_algorithm", None)
        context.pop("request_algorithm_header", None)
    if not getattr(_current, "ask", False):
        headers = params.get("headers", {})
        for name in list(headers.keys()):
            if name.lower() == "x-amz-checksum-mode":
                del headers[name]


_hooking = threading.Lock()


def _hook(client: Any) -> None:
    """Installs `_add_token` and `_rdma_checksums` on `client` (once:
    botocore keeps one handler per unique id). Under a lock: botocore
    checks the id, then adds the handler, with nothing held in between, so
    the transfers that start a new client's first requests together would
    each install them."""
    with _hooking:
        client.meta.events.register("before-sign.s3", _add_token, unique_id="hipobj-rdma-token")
        client.meta.events.register("before-call.s3", _rdma_checksums, unique_id="hipobj-rdma-checksums")


def _headers(response: Dict[str, Any]) -> Dict[str, str]:
    return response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}


def _status(response: Dict[str, Any]) -> int:
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _where(what: str, client: Any) -> str:
    """``GET bucket/key at http://endpoint``: what a message is about."""
    endpoint = getattr(getattr(client, "meta", None), "endpoint_url", None)
    return f"{what} at {endpoint}" if endpoint else what


def _s3_failure(where: str, error: BaseException, reply: Optional[str] = None) -> TransferError:
    """`error`, raised by the S3 client, as the ``TransferError`` of both
    paths: the S3 error's code, status and message where the server
    answered with one, else the client's own words."""
    response = getattr(error, "response", None)
    detail = response.get("Error") if isinstance(response, dict) else None
    if isinstance(detail, dict) and detail.get("Code"):
        code = str(detail["Code"])
        status = _status(response) or None
        text = f"S3 error {code}" + (f" (HTTP {status})" if status else "")
        if detail.get("Message"):
            text += f": {detail['Message']}"
        return TransferError(f"{where}: {text}", reply, error, code, status)
    return TransferError(f"{where}: {type(error).__name__}: {error}", reply, error)


class _Exchange:
    """One S3 call carrying a token, as the library's two callbacks: the
    call is made in ``sendRequest``, its ``x-amz-rdma-reply`` handed back in
    ``recvReply``. A 2xx answer without that header is a server without
    RDMA, read as a decline (501)."""

    def __init__(self, call: Callable[[], Dict[str, Any]], ask_checksum: bool = False):
        self.call = call
        #: A GET that asks for the server's CRC of what it writes.
        self.ask_checksum = ask_checksum
        self.response: Optional[Dict[str, Any]] = None
        self.error: Optional[BaseException] = None
        self.reply: Optional[str] = None
        self.ops = _lib.OpsT(_lib.SEND_REQUEST(self._send), _lib.RECV_REPLY(self._recv))

    def _send(self, _ctx: Any, token: int, length: int) -> int:
        try:
            _current.token = ctypes.string_at(token, length).decode("ascii")
            _current.ask = self.ask_checksum
            try:
                self.response = self.call()
            finally:
                _current.token = None
                _current.ask = False
            reply = _headers(self.response).get(REPLY_HEADER)
            self.reply = reply.strip() if reply is not None else str(_lib.REPLY_NOT_IMPLEMENTED)
            return 0
        except BaseException as e:  # noqa: BLE001 - nothing may cross into C
            self.error = e
            response = getattr(e, "response", None)
            if isinstance(response, dict):
                reply = _headers(response).get(REPLY_HEADER)
                if reply is not None:
                    # The server answered, with a failure status: the reply.
                    self.reply = reply.strip()
                    return 0
            return 1

    def _recv(self, _ctx: Any, reply: int, length_ptr: Any) -> int:
        if self.reply is None:
            return 1
        raw = self.reply.encode("ascii", "replace")
        if len(raw) > length_ptr[0]:
            return 1
        ctypes.memmove(reply, raw, len(raw))
        length_ptr[0] = len(raw)
        return 0

    def declined(self) -> bool:
        return self.reply is not None and _lib.parse_reply(self.reply) == _lib.REPLY_NOT_IMPLEMENTED


def _range_length(range_header: str) -> Tuple[int, int]:
    """``bytes=FIRST-LAST`` as (first, length)."""
    spec = range_header.strip()
    if not spec.startswith("bytes="):
        raise ValueError(f"Range {range_header!r} is not bytes=FIRST-LAST")
    first, _, last = spec[len("bytes="):].partition("-")
    if not first.isdigit() or not last.isdigit() or int(last) < int(first):
        raise ValueError(f"Range {range_header!r} is not bytes=FIRST-LAST")
    return int(first), int(last) - int(first) + 1


class Session:
    """libhipobj initialized in this process (one at a time: the C library
    has one instance per process), with its registered buffers.

    ``Session(nic="mlx5_0", gpu=0)`` runs ``hipObjInit``. Where it fails (no
    RDMA device, say) and ``require=False``, the session still works and
    every transfer is a plain-HTTP fallback (``strict`` transfers fail);
    ``available`` and ``reason`` say which. Use it as a context manager, or
    call ``close`` (``hipObjShutdown``): buffers registered through it are
    released then.

    Registration: what ``register`` was asked for stays registered until
    ``release`` or ``close``. Memory passed to a transfer stays registered
    after it while its object lives, among the `registration_cache` (16)
    used last, and is deregistered when evicted or when its object is
    freed; an object that takes no weak reference (``bytearray``) is
    registered for its transfer only. Read-only sources (``bytes``) are
    sent from one registered bounce buffer of at most `bounce_limit` bytes.

    Integrity (`verify`, on by default; each transfer may say otherwise):
    a PUT or part from host memory carries the CRC-64/NVME of its bytes
    (``x-amz-checksum-crc64nvme``: with RDMA, of the bytes the server
    READs; the server refuses bytes that do not match it), a multipart
    upload declares and completes with the whole object's; a GET into host
    memory asks for the server's CRC of the bytes it wrote and compares it
    with the bytes in `into` (a mismatch, or an RDMA reply without the CRC,
    raises ``TransferError``). GPU memory is neither checked nor
    checksummed: it cannot be read without a copy. ``Transfer.verified``
    says what was.
    """

    def __init__(
        self,
        nic: Optional[str] = None,
        gpu: int = -1,
        require: bool = False,
        *,
        registration_cache: int = _registry.CACHE,
        bounce_limit: int = _registry.BOUNCE_LIMIT,
        sysfs_root: str = "/",
        verify: bool = True,
        max_in_flight: int = 16,
    ):
        if registration_cache < 0 or bounce_limit < 0:
            raise ValueError("registration_cache and bounce_limit are counts: 0 or more")
        if max_in_flight < 1:
            raise ValueError("max_in_flight is a count: 1 or more")
        #: The most asynchronous transfers that run at once (the library's
        #: connections, HIPOBJ_MAX_TRANSFERS, 16 by default, bound them too).
        self.max_in_flight = max_in_flight
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self.stats = Stats()
        #: Buffers passed to transfers that stay registered after them.
        self.registration_cache = registration_cache
        #: The most bytes the bounce buffer of read-only sources grows to.
        self.bounce_limit = bounce_limit
        #: Whether transfers check their bytes unless told otherwise.
        self.verify = verify
        self.available = False
        self.reason: Optional[str] = None
        #: The NICs the library was initialized with (``nicHint``): `nic`,
        #: or those this session chose for host memory on a host without
        #: a GPU; ``None`` when the library chose.
        self.nic: Optional[str] = None
        self._open = False
        self._asked = (nic or None, gpu, sysfs_root)
        try:
            self._lib = _lib.library()
        except ImportError as e:
            if require:
                raise
            self._lib = None
            self.reason = str(e)
        else:
            self._initialize(require)
        self._registry = _registry.Registry(self._lib, registration_cache, HipObjError)
        self._bounce = _registry.Bounce(self._registry, bounce_limit)
        #: Opened in a parent process: initialized again at first use.
        self._inherited = False
        _sessions.add(self)
        global _active
        _active = self

    # ------------------------------------------------------------ lifecycle

    def _init_call(self, nic: Optional[str], gpu: int) -> Any:
        config = _lib.ConfigT()
        config.gpuDevice = gpu
        config.nicHint = nic.encode() if nic else None
        return self._lib.hipObjInit(ctypes.byref(config))

    def _initialize(self, require: bool) -> None:
        """``hipObjInit`` with what the session was asked for. Without a
        GPU (hipError 100), with no NIC named and no GPU asked for, again
        on the NICs with an active port (``_nics``), serving host memory.
        Sets `available`, or `reason`; raises when `require` (and for
        ``hipObjAlreadyInitialized``)."""
        nic, gpu, sysfs_root = self._asked
        err = self._init_call(nic, gpu)
        if err.opError == _lib.SUCCESS:
            self.available = self._open = True
            self.nic = nic
            return
        if err.opError == 3:
            raise HipObjError("hipObjInit", err.opError, err.hipError)
        why = ""
        no_gpu = err.opError == _lib.RDMA_ERROR and err.hipError == _lib.HIP_ERROR_NO_DEVICE
        if no_gpu and nic is None and not _nics.named_by_environment():
            if gpu != -1:
                why = (
                    f"no GPU can be used, and gpu={gpu} was asked for: open the session without gpu= "
                    "to serve host memory only"
                )
            else:
                nics = _nics.active_devices(sysfs_root)
                if not nics:
                    where = os.path.join(sysfs_root, "sys", "class", "infiniband")
                    why = (
                        "no GPU and no NIC named (pass nic= or set HIPOBJ_NIC_HINT), and no RDMA device "
                        f"with an active port under {where} to serve host memory with"
                    )
                else:
                    hint = ",".join(nics)
                    retry = self._init_call(hint, gpu)
                    if retry.opError == _lib.SUCCESS:
                        self.available = self._open = True
                        self.nic = hint
                        return
                    err = retry
                    why = f"no GPU, so host memory on the RDMA devices with an active port ({hint}), which failed too"
        elif nic is not None and err.opError in (_lib.RDMA_ERROR, _lib.NIC_NOT_FOUND):
            # The library's own words go to stderr only: say what sysfs shows.
            active = _nics.active_devices(sysfs_root)
            missing = [name.strip() for name in nic.split(",") if name.strip() and name.strip() not in active]
            if missing:
                why = (
                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not among the RDMA devices "
                    f"with an active port (those: {', '.join(active) or 'none'})"
                )
        failure = HipObjError("hipObjInit", err.opError, err.hipError, why)
        if require:
            raise failure
        self.reason = f"the library did not initialize ({failure})"

    def _forked(self) -> None:
        """In a forked child (``_after_fork_in_child``): the instance and
        the registrations are the parent's. They are forgotten, never
        deregistered or shut down from here; an open session initializes
        the library afresh, for this process, at its next use."""
        self._lock = threading.Lock()
        # The parent's transfer threads are not in this process.
        self._executor = None
        self._registry.abandon()
        self._bounce.abandon()
        self._registry = _registry.Registry(self._lib, self.registration_cache, HipObjError)
        self._bounce = _registry.Bounce(self._registry, self.bounce_limit)
        if self._open:
            self._open = False
            self.available = False
            self._inherited = True
            self.reason = "opened in the parent of this forked process, not initialized in it yet"

    def _initialize_in_child(self) -> None:
        """A session inherited by fork: ``hipObjInit`` for this process, once
        (a library that keeps the parent's instance in a child answers
        ``hipObjAlreadyInitialized``: the session then falls back)."""
        if not self._inherited:
            return
        with self._lock:
            if not self._inherited:
                return
            self._inherited = False
            try:
                self._initialize(require=False)
            except HipObjError as e:
                self.reason = (
                    f"the session was opened before this process was forked, and in this process {e}: "
                    "this libhipobj keeps the parent's instance in a forked child, where it cannot be used, "
                    "so transfers here go over plain HTTP"
                )
            else:
                if not self.available:
                    self.reason = f"the session was opened before this process was forked, and {self.reason}"

    def close(self) -> None:
        """Cancels the asynchronous transfers not started yet and waits for
        those running, deregisters every buffer and shuts the library down;
        transfers after it fall back."""
        global _active
        if _active is self:
            _active = None
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self._inherited = False
        with self._lock:
            was_open, self._open = self._open, False
            if self.available:
                self.available = False
                self.reason = "the session is closed"
        if was_open:
            self._registry.close()
            self._lib.hipObjShutdown()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ registration

    def register(self, obj: Any) -> _buffers.View:
        """Registers the memory of `obj` (host or GPU) and keeps it
        registered, and `obj` alive, until ``release(obj)`` or ``close``; a
        loop of transfers into the same array, or into parts of it,
        registers once. Registering it again returns the same registration.
        A read-only buffer cannot be registered (``UnusableBufferError``);
        ``HipObjError`` when the library refuses."""
        return self._register(obj)[0]

    def _register(self, obj: Any) -> Tuple[_buffers.View, bool]:
        """`register`, and whether it made the registration explicit."""
        view = _buffers.view_of(obj, writable=False)
        if view.data is not None:
            raise _buffers.UnusableBufferError(
                "the buffer is read-only and the library registers writable memory "
                "(a PUT of it goes through the session's bounce buffer, registered once)"
            )
        self._initialize_in_child()
        if not self.available:
            raise HipObjError("hipObjBufRegister", 2, detail=self.reason or "")
        try:
            return view, self._registry.register(view, obj)[1]
        except _registry.RegistrationError as e:
            raise e.error from None

    def release(self, obj: Any) -> bool:
        """Deregisters `obj`'s memory if this session registered it
        (``register``, or a transfer that cached it): at once, or when the
        transfers using it end. Whether it did."""
        view = _buffers.view_of(obj, writable=False)
        if view.data is not None or self._lib is None or self._inherited:
            return False
        return self._registry.release(view)

    def registered(self, obj: Any) -> "_RegisteredBlock":
        """``with session.registered(tensor): ...``: registered for the
        block (released after it, unless it was registered before)."""
        return _RegisteredBlock(self, obj)

    def registered_count(self) -> int:
        """Registrations this session holds now: explicit ones, cached
        ones, those of transfers in flight, and the bounce buffer once made."""
        return self._registry.count() if self._lib is not None else 0

    # ------------------------------------------------------------ transfers

    def _run(
        self, op: int, base: int, offset: int, length: int, call: Callable[[], Dict[str, Any]], ask: bool
    ) -> _Exchange:
        """One hipObjGet/hipObjPut of the registration at `base`, with
        `call` as its S3 request (`ask`: a GET that asks for the server's
        CRC); the exchange (its `error` set on failure)."""
        exchange = _Exchange(call, ask)
        fn = self._lib.hipObjGet if op == _lib.OP_GET else self._lib.hipObjPut
        err = fn(None, base, length, offset, ctypes.byref(exchange.ops), None)
        exchange.code = err.opError  # type: ignore[attr-defined]
        exchange.hip_error = err.hipError  # type: ignore[attr-defined]
        return exchange

    def _by_rdma(
        self,
        op: int,
        view: _buffers.View,
        obj: Any,
        offset: int,
        length: int,
        call: Callable[[], Dict[str, Any]],
        held: Optional[_registry.Entry] = None,
        ask: bool = False,
    ) -> Tuple[Optional[_Exchange], Optional[str], Optional[BaseException]]:
        """Runs the transfer by RDMA where it can be tried: ``(exchange,
        None, None)``; else ``(None, why not, the error behind it)``.
        `held` is a registration of `view` the caller holds; `ask`, a GET
        that asks for the server's CRC of what it writes."""
        self._initialize_in_child()
        if not self.available:
            return None, f"no RDMA: {self.reason}", None
        if view.data is not None:
            too_large = self._bounce.too_large(length)
            if too_large is not None:
                return None, too_large, None
            try:
                with self._bounce.fill(view.data[offset : offset + length]) as entry:
                    return self._run(op, entry.ptr, 0, length, call, ask), None, None
            except _registry.RegistrationError as e:
                return None, f"registering the bounce buffer failed ({e.error})", e.error
        entry = held
        if entry is None:
            try:
                entry = self._registry.acquire(view, obj)
            except _registry.RegistrationError as e:
                return None, f"registering the buffer failed ({e.error})", e.error
        try:
            return self._run(op, entry.ptr, offset + view.ptr - entry.ptr, length, call, ask), None, None
        finally:
            if held is None:
                self._registry.unlease(entry)

    def get_object(
        self,
        client: Any,
        Bucket: str,
        Key: str,
        into: Any,
        Range: Optional[str] = None,
        offset: int = 0,
        strict: bool = False,
        verify: Optional[bool] = None,
        **kwargs: Any,
    ) -> Transfer:
        """Fills `into` (from byte `offset`) with the object's bytes: with
        `Range` (``bytes=FIRST-LAST``) those, else the object's first
        ``len(into) - offset``; an object shorter than that is an error. By
        RDMA into `into` itself (host or GPU memory, registered as the
        class says), else, when the server declines or the memory cannot be
        registered, and not `strict`, over plain HTTP (from the body of the
        same answer, where the server sent one). With `verify` (the
        session's by default) and host memory, the bytes are compared with
        the server's CRC-64/NVME of what it wrote (RDMA), or with the
        checksum of a whole object's answer (plain HTTP). Other keyword
        arguments go to the client's ``get_object``.

        With ``IfMatch`` (an ETag, quoted as S3 sends it) the transfer is
        pinned to that version: the request carries it (S3 answers 412
        when the object is no longer that version) and the answer's ETag,
        by RDMA or plain HTTP, must be it (a store that ignores the
        condition); otherwise ``ObjectChangedError``. By RDMA the bytes
        of an answer with another ETag are in `into` by then."""
        view = _buffers.view_of(into, writable=True)
        check = (self.verify if verify is None else verify) and not view.device
        if Range is None:
            length = view.nbytes - offset
            Range = f"bytes=0-{length - 1}" if length > 0 else None
        else:
            length = _range_length(Range)[1]
        if length <= 0 or offset < 0 or offset + length > view.nbytes:
            raise ValueError(f"{length} bytes at offset {offset} do not fit a buffer of {view.nbytes}")
        _hook(client)

        asked = dict(kwargs)
        if check:
            asked.setdefault("ChecksumMode", "ENABLED")

        def call() -> Dict[str, Any]:
            return client.get_object(Bucket=Bucket, Key=Key, Range=Range, **asked)

        what = _where(f"GET {Bucket}/{Key}", client)
        expected = kwargs.get("IfMatch")
        try:
            return self._get(what, view, into, offset, length, call, check, strict, expected)
        except ObjectChangedError:
            raise
        except TransferError as e:
            if expected is not None and e.http_status == 412:
                raise ObjectChangedError(what, expected, None, e.cause) from e
            raise

    def _pinned(self, what: str, expected: Optional[str], response: Dict[str, Any]) -> None:
        """Raises ``ObjectChangedError`` when `response` has an ETag other
        than `expected` (if given)."""
        found = _headers(response).get("etag")
        if expected is not None and found is not None and found != expected:
            self.stats.fail()
            raise ObjectChangedError(what, expected, found)

    def _get(
        self,
        what: str,
        view: _buffers.View,
        into: Any,
        offset: int,
        length: int,
        call: Callable[[], Dict[str, Any]],
        check: bool,
        strict: bool,
        expected: Optional[str],
    ) -> Transfer:
        """``get_object``'s transfer, once its request is made."""
        unverified = None if check else (GPU_UNVERIFIED if view.device else OFF_UNVERIFIED)
        exchange, reason, cause = self._by_rdma(_lib.OP_GET, view, into, offset, length, call, ask=check)
        if exchange is not None:
            if exchange.code == _lib.SUCCESS:
                response = exchange.response or {}
                if "Body" in response:
                    response["Body"].close()
                self._pinned(what, expected, response)
                moved = _headers(response).get(BYTES_HEADER)
                if moved is not None and int(moved) != length:
                    self.stats.fail()
                    raise TransferError(
                        f"{what}: the server moved {moved} of {length} bytes (the object is shorter)",
                        exchange.reply,
                    )
                if check:
                    self._verify_rdma(what, exchange, _checksums.host_memory(view.ptr + offset, length))
                return self._counted(Transfer("rdma", length, verified=check, unverified=unverified))
            reason = self._refusal(what, exchange)
        if strict:
            self._strict(what, reason, cause)
        response = exchange.response if exchange is not None else None
        if response is None or not 200 <= _status(response) < 300:
            response = self._s3(what, call)
        self._pinned(what, expected, response)
        body = self._s3(what, response["Body"].read)
        if len(body) != length:
            self.stats.fail()
            raise TransferError(f"{what}: {len(body)} bytes came, {length} were asked for")
        if check:
            unverified = self._verify_body(what, response, body)
        # A cancelled task's GET that fell back: its body never lands.
        if _cancelled():
            raise _Cancelled(f"{what}: its task was cancelled: the body received was not written into the buffer")
        _buffers.land(view, offset, body, _gpu.copier()[0] if view.device else None)
        return self._counted(Transfer("fallback", length, reason, verified=unverified is None, unverified=unverified))

    def put_object(
        self,
        client: Any,
        Bucket: str,
        Key: str,
        source: Any,
        offset: int = 0,
        length: Optional[int] = None,
        strict: bool = False,
        verify: Optional[bool] = None,
        **kwargs: Any,
    ) -> Transfer:
        """Stores `length` bytes of `source` from `offset` (by default all
        of it) as the object: by RDMA from `source` itself (a read-only
        source from the session's bounce buffer), else, when the server
        declines or the memory cannot be registered, and not `strict`, as
        the request's body. With `verify` (the session's by default) and
        host memory, the request carries the CRC-64/NVME of those bytes
        (``ChecksumCRC64NVME``; then no other ``Checksum*`` argument may be
        given). Other keyword arguments go to the client's
        ``put_object``."""
        view = _buffers.view_of(source, writable=False)
        verify = self.verify if verify is None else verify
        return self._put(client, Bucket, Key, source, view, offset, length, strict, None, kwargs, verify=verify)[0]

    def _put(
        self, client, Bucket, Key, source, view, offset, length, strict, part, kwargs, held=None, verify=True
    ) -> Tuple[Transfer, Optional[str], Optional[int]]:
        """A PUT (or, with `part` = (upload id, number), an UploadPart) of
        `view`, the memory of `source` (`held`: its registration, held by
        the caller): what it did, the answer's ETag, and the CRC-64/NVME it
        carried (with `verify`, of host memory)."""
        if length is None:
            length = view.nbytes - offset
        if length <= 0 or offset < 0 or offset + length > view.nbytes:
            raise ValueError(f"{length} bytes at offset {offset} do not fit a buffer of {view.nbytes}")
        _hook(client)
        crc = None
        unverified = GPU_UNVERIFIED if view.device else OFF_UNVERIFIED
        if verify and not view.device:
            named = [k for k in kwargs if k.startswith("Checksum")]
            if named:
                raise ValueError(
                    f"{', '.join(named)}: the session sends the CRC-64/NVME of the bytes it moves; "
                    "pass verify=False to send checksums of your own"
                )
            memory = view.data[offset : offset + length] if view.data is not None else None
            crc = _checksums.crc64nvme(
                memory if memory is not None else _checksums.host_memory(view.ptr + offset, length)
            )
            kwargs = dict(kwargs, ChecksumCRC64NVME=_checksums.encode(crc))
            unverified = None
        if part is None:
            what = _where(f"PUT {Bucket}/{Key}", client)

            def send(body: bytes) -> Dict[str, Any]:
                return client.put_object(Bucket=Bucket, Key=Key, Body=body, **kwargs)
        else:
            upload_id, number = part
            what = _where(f"PUT {Bucket}/{Key} part {number}", client)

            def send(body: bytes) -> Dict[str, Any]:
                return client.upload_part(
                    Bucket=Bucket, Key=Key, UploadId=upload_id, PartNumber=number, Body=body, **kwargs
                )

        exchange, reason, cause = self._by_rdma(
            _lib.OP_PUT, view, source, offset, length, lambda: send(b""), held
        )
        verified = unverified is None
        if exchange is not None:
            if exchange.code == _lib.SUCCESS:
                etag = _headers(exchange.response or {}).get("etag")
                return self._counted(Transfer("rdma", length, verified=verified, unverified=unverified)), etag, crc
            reason = self._refusal(what, exchange)
        if strict:
            self._strict(what, reason, cause)
        body = _buffers.host_bytes(view, offset, length, _gpu.copier()[1] if view.device else None)
        response = self._s3(what, lambda: send(body))
        etag = _headers(response).get("etag")
        t = Transfer("fallback", length, reason, verified=verified, unverified=unverified)
        return self._counted(t), etag, crc

    def upload(
        self,
        client: Any,
        Bucket: str,
        Key: str,
        source: Any,
        part_size: int = 64 << 20,
        strict: bool = False,
        verify: Optional[bool] = None,
        jobs: int = 1,
    ) -> Transfer:
        """Stores all of `source` as the object: one ``put_object`` up to
        `part_size` bytes, a multipart upload of `part_size` parts above
        (aborted if a part fails), each part by RDMA or its own fallback,
        `jobs` parts at once.
        The source is registered once for all its parts (a read-only one
        goes through the bounce buffer part by part). With `verify` (the
        session's by default) and host memory, every part carries its
        CRC-64/NVME and the upload, created as ``CRC64NVME``
        ``FULL_OBJECT``, completes with the whole object's."""
        view = _buffers.view_of(source, writable=False)
        total = view.nbytes
        verify = self.verify if verify is None else verify
        if total <= part_size:
            return self.put_object(client, Bucket, Key, source, strict=strict, verify=verify)
        if part_size < MIN_PART:
            raise ValueError(f"parts of a multipart upload are at least {MIN_PART} bytes")
        if jobs < 1:
            raise ValueError("jobs is a count: 1 or more")
        held = None
        self._initialize_in_child()
        if self.available and view.data is None:
            try:
                held = self._registry.acquire(view, source)
            except _registry.RegistrationError:
                pass  # each part tries again, and says why it fell back
        try:
            return self._upload(client, Bucket, Key, source, view, part_size, strict, held, verify, jobs)
        finally:
            if held is not None:
                self._registry.unlease(held)

    def _upload(self, client, Bucket, Key, source, view, part_size, strict, held, verify, jobs=1) -> Transfer:
        total = view.nbytes
        # GPU memory is not read for a CRC: its parts carry none, and the
        # upload declares none.
        full_object = verify and not view.device
        declared = {"ChecksumAlgorithm": "CRC64NVME", "ChecksumType": "FULL_OBJECT"} if full_object else {}
        upload_id = self._s3(
            _where(f"CreateMultipartUpload {Bucket}/{Key}", client),
            lambda: client.create_multipart_upload(Bucket=Bucket, Key=Key, **declared),
        )["UploadId"]
        parts = []
        paths = set()
        reason = None
        whole = 0
        last = None
        try:
            spans = [(number, offset, min(part_size, total - offset))
                     for number, offset in enumerate(range(0, total, part_size), start=1)]

            def one(span: Tuple[int, int, int]) -> Tuple[Transfer, Optional[str], Optional[int]]:
                number, offset, length = span
                return self._put(
                    client, Bucket, Key, source, view, offset, length, strict, (upload_id, number), {}, held, verify
                )

            if jobs == 1 or len(spans) == 1:
                done = [one(span) for span in spans]
            else:
                # Its own threads: an upload run on the session's transfer
                # threads must not wait for them.
                with concurrent.futures.ThreadPoolExecutor(
                    max_workers=min(jobs, len(spans)), thread_name_prefix="hipobj-part"
                ) as pool:
                    futures = [pool.submit(one, span) for span in spans]
                    done = _gather(futures, False)  # type: ignore[assignment]
            for (number, _, length), (t, etag, crc) in zip(spans, done):  # type: ignore[misc]
                paths.add(t.path)
                reason = reason or t.reason
                last = t
                part = {"PartNumber": number, "ETag": etag}
                if full_object and crc is not None:
                    part["ChecksumCRC64NVME"] = _checksums.encode(crc)
                    whole = _checksums.combine(whole, crc, length)
                parts.append(part)
            complete = {}
            if full_object:
                complete = {"ChecksumCRC64NVME": _checksums.encode(whole), "ChecksumType": "FULL_OBJECT"}
            self._s3(
                _where(f"CompleteMultipartUpload {Bucket}/{Key}", client),
                lambda: client.complete_multipart_upload(
                    Bucket=Bucket, Key=Key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **complete
                ),
            )
        except BaseException:
            client.abort_multipart_upload(Bucket=Bucket, Key=Key, UploadId=upload_id)
            raise
        path = "rdma" if paths == {"rdma"} else "fallback"
        unverified = last.unverified if last is not None else None
        return Transfer(path, total, reason, parts=len(parts), verified=unverified is None, unverified=unverified)

    # ------------------------------------------------------------ asynchronous

    def _submit(
        self,
        fn: Callable[..., Transfer],
        *args: Any,
        _cancel: Optional[threading.Event] = None,
        **kwargs: Any,
    ) -> "concurrent.futures.Future[Transfer]":
        """`fn(*args, **kwargs)` on the session's transfer threads (at most
        `max_in_flight` run at once; the rest wait, first in, first out),
        with `_cancel` as its cancel flag (see ``_until_ended``)."""
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_in_flight, thread_name_prefix="hipobj-transfer"
                )
            return self._executor.submit(_within, _cancel, fn, *args, **kwargs)

    async def _until_ended(self, fn: Callable[..., Transfer], *args: Any, **kwargs: Any) -> Transfer:
        """`fn(*args, **kwargs)` on a transfer thread, awaited. When the
        awaiting task is cancelled: a transfer not started never starts;
        one started sends no request after the cancel (its flag is checked
        before each request is signed, and before a fallback's body
        lands); one whose request already left cannot be called back (the
        server moves the bytes), so this waits for it to end, shielded (a
        second cancel does not stop the wait), and only then re-raises
        ``CancelledError``: once it reaches the caller, nothing more lands
        in the buffer or is read from it."""
        cancel = threading.Event()
        future = self._submit(fn, *args, _cancel=cancel, **kwargs)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            cancel.set()
            # A transfer not started: cancelled here (wrap_future did too).
            future.cancel()
            while not future.done():
                try:
                    await asyncio.shield(asyncio.wrap_future(future))
                except asyncio.CancelledError:
                    continue
                except Exception:  # noqa: BLE001 - the transfer's own end: it ended
                    break
            raise

    def get_object_async(self, client: Any, Bucket: str, Key: str, into: Any, **kwargs: Any) -> "concurrent.futures.Future[Transfer]":
        """``get_object`` without waiting: a ``concurrent.futures.Future``
        of its ``Transfer`` (or of its error). The buffer is checked here
        (a buffer that cannot be used raises now); the transfer runs on one
        of the session's transfer threads, which wait in the library with
        the GIL released. Do not touch `into` until the future is done.
        ``cancel()`` stops a transfer that has not started; one that has
        runs to its end (the server's access ends with it)."""
        _buffers.view_of(into, writable=True)
        return self._submit(self.get_object, client, Bucket, Key, into, **kwargs)

    def put_object_async(self, client: Any, Bucket: str, Key: str, source: Any, **kwargs: Any) -> "concurrent.futures.Future[Transfer]":
        """``put_object`` without waiting, as ``get_object_async``. Do not
        change `source` until the future is done."""
        _buffers.view_of(source, writable=False)
        return self._submit(self.put_object, client, Bucket, Key, source, **kwargs)

    async def aget_object(self, client: Any, Bucket: str, Key: str, into: Any, **kwargs: Any) -> Transfer:
        """``get_object`` as an asyncio coroutine: the event loop runs on
        while the transfer does.

        Cancelling the task (``task.cancel()``, ``asyncio.wait_for``'s
        time-out, a ``TaskGroup`` that fails): a transfer not started never
        starts; one started sends no request after the cancel, and a
        fallback's body received after it is not written into `into`. A
        request already sent cannot be called back: the server writes the
        bytes, so the coroutine waits, shielded (cancelling it again does
        not end the wait), until the transfer has ended and the server's
        access to `into` with it, and only then raises ``CancelledError``.
        When it does, nothing more lands in `into` (which may hold the
        object's bytes, some of them, or what it held before)."""
        _buffers.view_of(into, writable=True)
        return await self._until_ended(self.get_object, client, Bucket, Key, into, **kwargs)

    async def aput_object(self, client: Any, Bucket: str, Key: str, source: Any, **kwargs: Any) -> Transfer:
        """``put_object`` as an asyncio coroutine, as ``aget_object``.
        Cancelling the task: a PUT whose request was not sent is never
        sent; one already sent may be stored, but before ``CancelledError``
        is raised, never after, and `source` is not read after it."""
        _buffers.view_of(source, writable=False)
        return await self._until_ended(self.put_object, client, Bucket, Key, source, **kwargs)

    def get_objects(
        self, client: Any, requests: Iterable[Mapping[str, Any]], *, return_exceptions: bool = False
    ) -> List[Union[Transfer, BaseException]]:
        """Many ``get_object`` at once (each request a mapping of its
        arguments: ``Bucket``, ``Key``, ``into``, ...), at most
        `max_in_flight` in flight: their ``Transfer`` in the requests'
        order. A failure raises the first error in that order once every
        transfer has ended (those not started are cancelled first);
        `return_exceptions` puts each error in its place instead."""
        futures = [self.get_object_async(client, **r) for r in requests]
        return _gather(futures, return_exceptions)

    def put_objects(
        self, client: Any, requests: Iterable[Mapping[str, Any]], *, return_exceptions: bool = False
    ) -> List[Union[Transfer, BaseException]]:
        """Many ``put_object`` at once (``Bucket``, ``Key``, ``source``,
        ...), as ``get_objects``."""
        futures = [self.put_object_async(client, **r) for r in requests]
        return _gather(futures, return_exceptions)

    # ------------------------------------------------------------ helpers

    def _counted(self, t: Transfer) -> Transfer:
        self.stats.count(t)
        return t

    def _s3(self, where: str, call: Callable[[], Any]) -> Any:
        """`call`'s result; what the S3 client raised as a ``TransferError``
        (counted as a failure; a cancelled task's request as it is)."""
        try:
            return call()
        except _Cancelled as e:
            raise _Cancelled(f"{where}: {e}") from None
        except Exception as e:  # noqa: BLE001 - botocore's and urllib3's, all of them
            self.stats.fail()
            raise _s3_failure(where, e) from e

    def _verify_rdma(self, what: str, exchange: _Exchange, memory: Any) -> None:
        """Compares the bytes an RDMA GET wrote into host memory with the
        CRC-64/NVME its server says it wrote; raises on a mismatch, and
        when the reply carries none."""
        value = _headers(exchange.response or {}).get(_checksums.RDMA_CRC64NVME)
        if value is None:
            self.stats.fail()
            raise TransferError(
                f"{what}: the server's RDMA reply carries no {_checksums.RDMA_CRC64NVME}, so the bytes it wrote "
                "cannot be verified; a server that does not send it needs verify=False "
                "(hipobj.Session(verify=False), or verify=False on the call)",
                exchange.reply,
            )
        wrote = _checksums.decode(value)
        found = _checksums.crc64nvme(memory)
        if wrote != found:
            self.stats.fail()
            raise TransferError(
                f"{what}: the bytes in memory are not the bytes the server says it wrote by RDMA (the data did "
                f"not arrive, or arrived corrupted): the CRC-64/NVME of the {len(memory)} bytes here is "
                f"{_checksums.encode(found)}, the server's {_checksums.RDMA_CRC64NVME} says {value}",
                exchange.reply,
            )

    def _verify_body(self, what: str, response: Dict[str, Any], body: bytes) -> Optional[str]:
        """Compares a plain answer's body with the checksum of the whole
        object it carries; raises on a mismatch. ``None`` when checked,
        else why not."""
        sent = _checksums.whole_object(_status(response), _headers(response))
        if sent is None:
            return "a plain-HTTP answer carried no checksum of its bytes (S3 sends one only with a whole object)"
        name, value, function = sent
        width = 8 if name == _checksums.CRC64NVME else 4
        found = function(body)
        if found != value:
            self.stats.fail()
            raise TransferError(
                f"{what}: the bytes received are not the bytes the server says it sent: the checksum of the "
                f"{len(body)} bytes received is {_checksums.encode(found, width)}, the server's {name} says "
                f"{_checksums.encode(value, width)}"
            )
        return None

    def _strict(self, what: str, reason: Optional[str], cause: Optional[BaseException]) -> None:
        """Raises the refusal of a fallback that `strict` forbids."""
        self.stats.fail()
        raise TransferError(f"{what}: {reason}, and strict forbids the fallback", cause=cause) from cause

    def _refusal(self, what: str, exchange: _Exchange) -> str:
        """Why a transfer did not complete by RDMA, when it may fall back
        (a decline); else raises."""
        code = getattr(exchange, "code")
        if code == _lib.S3_ERROR and exchange.declined():
            return f"the server declined RDMA (x-amz-rdma-reply {exchange.reply})"
        if isinstance(exchange.error, _Cancelled):
            raise _Cancelled(f"{what}: {exchange.error}") from None
        self.stats.fail()
        if exchange.error is not None:
            raise _s3_failure(what, exchange.error, exchange.reply) from exchange.error
        detail = f"x-amz-rdma-reply {exchange.reply}" if exchange.reply else ""
        raise TransferError(
            f"{what}: "
            + str(HipObjError("hipObjGet" if what.startswith("GET") else "hipObjPut", code, getattr(exchange, "hip_error"), detail)),
            exchange.reply,
        )


def _gather(futures: List["concurrent.futures.Future[Any]"], return_exceptions: bool) -> List[Any]:
    """The futures' results in order, once all have ended; see
    ``Session.get_objects``."""
    results: List[Any] = []
    first: Optional[BaseException] = None
    for i, future in enumerate(futures):
        try:
            results.append(future.result())
        except concurrent.futures.CancelledError as e:
            results.append(e)
            first = first or e
        except Exception as e:  # noqa: BLE001 - the transfer's own error, kept for the caller
            results.append(e)
            if first is None:
                first = e
                if not return_exceptions:
                    for later in futures[i + 1 :]:
                        later.cancel()
    if first is not None and not return_exceptions:
        raise first
    return results


class _RegisteredBlock:
    def __init__(self, session: Session, obj: Any):
        self.session = session
        self.obj = obj
        self.ours = False

    def __enter__(self) -> _buffers.View:
        view, self.ours = self.session._register(self.obj)
        return view

    def __exit__(self, *exc: Any) -> None:
        if self.ours:
            self.session.release(self.obj)
