"""Models and checkpoints in the safetensors format, moved between S3 and
tensors in host or GPU memory by RDMA.

    import boto3, hipobj
    from hipobj import safetensors

    s3 = boto3.client("s3", endpoint_url="http://s3.example:9000")
    with hipobj.Session(gpu=0) as session:
        weights = safetensors.load(s3, "models", "llm/model.safetensors",
                                   framework="torch", device="cuda:0")
        shards = safetensors.load_sharded(s3, "models", "llm/model.safetensors.index.json",
                                          framework="torch", device="cuda:0")
        safetensors.save(s3, weights, "checkpoints", "step-100.safetensors")

Loading reads the header by a ranged GET, allocates one buffer for all the
file's tensor data (on the device asked for), registers it once, and GETs
the data into it in spans of at most `span` bytes, many in flight
(``Session.max_in_flight``), by RDMA straight into that buffer; each tensor
is a view of its bytes there (a copy only where a tensor's offset is not a
multiple of its item size, which safetensors' own writer never makes). A
sharded model's index names its shards; all their spans are in flight
together.

A load reads one version of each file: the one whose header it read
first. Every later GET of the file (the rest of a long header, each span)
carries ``IfMatch`` with the ETag of that first answer, and each answer's
ETag must be it; an object re-saved during the load fails it with
``hipobj.ObjectChangedError``, naming the bucket and key, rather than
giving tensors mixed from two versions. Each shard of a sharded model is
pinned to its own version. (A store that sends no ETag cannot be pinned.)

Saving lays the file out in one buffer on the device the tensors are on
(header, then each tensor's bytes, largest items first, as safetensors'
own writer orders them), and uploads it by multipart parts read by RDMA
from that buffer, `jobs` at once.

Frameworks: ``"numpy"`` (host memory), ``"torch"`` (``device`` any PyTorch
device: ``"cpu"``, ``"cuda:0"``), ``"cupy"`` (the current CUDA device).
PyTorch and CuPy are optional: imported only when asked for. bfloat16 and
the float8 types exist only in PyTorch.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _session

#: safetensors' dtypes: their item sizes.
ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}

#: A framework's dtype name (NumPy's ``dtype.name``, PyTorch's without
#: ``torch.``) to safetensors'.
_TO_SAFETENSORS = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_FROM_SAFETENSORS = {v: k for k, v in _TO_SAFETENSORS.items()}

#: Bytes of the first GET: the header's length and, usually, the header.
_FIRST = 64 << 10
#: The largest header safetensors' own loader accepts.
MAX_HEADER = 100_000_000


class FormatError(ValueError):
    """An object that is not a valid safetensors file, or an index that is
    not a valid sharded model's."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file's header."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    #: Its bytes in the file's data, ``[begin, end)``.
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A safetensors file's header."""

    #: Where the tensor data starts in the file: 8 + the header's length.
    data_start: int
    #: Bytes of tensor data.
    data_len: int
    tensors: Tuple[TensorInfo, ...]
    metadata: Dict[str, str]
    #: The ETag of the object it was read from (quoted, as S3 sends it):
    #: the version a load reads; ``None`` from ``parse_header``, or from a
    #: store that sends none.
    etag: Optional[str] = None


def parse_header(raw: bytes, size: Optional[int] = None) -> Header:
    """The header of a file whose first bytes are `raw` (at least the 8 of
    its length and the header itself); `size`, the object's size, if known,
    is checked against the data the header describes."""
    if len(raw) < 8:
        raise FormatError("shorter than the 8 bytes of a safetensors header's length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER:
        raise FormatError(f"a header of {n} bytes (more than {MAX_HEADER})")
    if len(raw) < 8 + n:
        raise FormatError(f"the header is {n} bytes and only {len(raw) - 8} came")
    try:
        doc = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"the header is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise FormatError("the header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("__metadata__ is not a map of strings")
    tensors = []
    for name, info in doc.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"tensor {name!r}: {e!r} in {info!r}") from e
        if dtype not in ITEMSIZE:
            raise FormatError(f"tensor {name!r}: unknown dtype {dtype!r}")
        count = 1
        for d in shape:
            if d < 0:
                raise FormatError(f"tensor {name!r}: shape {shape}")
            count *= d
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise FormatError(f"tensor {name!r}: data_offsets {[begin, end]}")
        if end - begin != count * ITEMSIZE[dtype]:
            raise FormatError(
                f"tensor {name!r}: {end - begin} bytes for {count} items of {dtype} ({count * ITEMSIZE[dtype]})"
            )
        tensors.append(TensorInfo(name, dtype, shape, begin, end))
    tensors.sort(key=lambda t: (t.begin, t.end))
    at = 0
    for t in tensors:
        if t.begin != at:
            raise FormatError(f"tensor {t.name!r} starts at {t.begin}, not where the one before ends ({at})")
        at = t.end
    if size is not None and 8 + n + at != size:
        raise FormatError(f"the header describes {8 + n + at} bytes and the object has {size}")
    return Header(8 + n, at, tuple(tensors), metadata)


# ---------------------------------------------------------------- frameworks


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError as e:
        raise ImportError("framework='torch' needs PyTorch (pip install torch)") from e
    return torch


def _cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - optional
    except ImportError as e:
        raise ImportError("framework='cupy' needs CuPy") from e
    return cupy


def _numpy() -> Any:
    try:
        import numpy  # noqa: PLC0415 - optional
    except ImportError as e:
        raise ImportError("framework='numpy' needs NumPy (pip install hipobj[numpy])") from e
    return numpy


def _allocate(framework: str, device: Optional[str], nbytes: int) -> Any:
    """`nbytes` bytes (uint8) of the framework's memory on `device`."""
    if framework == "numpy":
        if device not in (None, "cpu"):
            raise ValueError(f"NumPy arrays live in host memory, not on {device!r}")
        return _numpy().empty(nbytes, dtype="uint8")
    if framework == "torch":
        torch = _torch()
        return torch.empty(nbytes, dtype=torch.uint8, device=device or "cpu")
    if framework == "cupy":
        if device not in (None, "cuda"):
            raise ValueError("CuPy allocates on the current device: leave device unset")
        return _cupy().empty(nbytes, dtype="uint8")
    raise ValueError(f"framework is 'numpy', 'torch' or 'cupy', not {framework!r}")


def _dtype(framework: str, st: str) -> Any:
    name = _FROM_SAFETENSORS[st]
    if framework == "torch":
        torch = _torch()
        found = getattr(torch, name, None)
        if found is None:
            raise FormatError(f"this PyTorch has no {name} for {st}")
        return found
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise FormatError(f"{st} tensors need framework='torch' (NumPy and CuPy have no {name})")
    return (_numpy() if framework == "numpy" else _cupy()).dtype(name)


def _view(framework: str, buffer: Any, t: TensorInfo) -> Any:
    """Tensor `t` over its bytes in `buffer` (a copy where misaligned)."""
    dtype = _dtype(framework, t.dtype)
    raw = buffer[t.begin : t.end]
    if t.begin % ITEMSIZE[t.dtype] != 0:
        raw = raw.clone() if framework == "torch" else raw.copy()
    if framework == "torch":
        return raw.view(dtype).reshape(t.shape)
    return raw.view(dtype).reshape(t.shape)


def _dtype_name(tensor: Any) -> str:
    dtype = tensor.dtype
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if not isinstance(name, str) or name not in _TO_SAFETENSORS:
        raise TypeError(f"a tensor of dtype {dtype} has no safetensors dtype")
    return _TO_SAFETENSORS[name]


def _bytes_of(tensor: Any) -> Tuple[str, Any, bool]:
    """`tensor`'s framework, its bytes as a flat uint8 tensor of that
    framework (contiguous), and whether it is in GPU memory."""
    module = type(tensor).__module__.split(".")[0]
    if module == "torch":
        flat = tensor.detach().contiguous().reshape(-1)
        return "torch", flat.view(_torch().uint8), flat.is_cuda
    if module == "cupy":
        cupy = _cupy()
        return "cupy", cupy.ascontiguousarray(tensor).reshape(-1).view(cupy.uint8), True
    numpy = _numpy()
    array = numpy.ascontiguousarray(tensor)
    return "numpy", array.reshape(-1).view(numpy.uint8), False


# ---------------------------------------------------------------- loading


def _session_of(session: Optional[_session.Session]) -> _session.Session:
    return session if session is not None else _session.active()


def _pinned_get(client: Any, where: str, etag: Optional[str], **kwargs: Any) -> Dict[str, Any]:
    """``client.get_object(**kwargs)`` at version `etag` (if given):
    ``IfMatch``, and the answer's ETag compared; ``ObjectChangedError``
    when the object is no longer that version."""
    if etag is None:
        return client.get_object(**kwargs)
    try:
        answer = client.get_object(IfMatch=etag, **kwargs)
    except Exception as e:  # noqa: BLE001 - botocore's ClientError, read without importing botocore
        response = getattr(e, "response", None)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
        if status == 412:
            raise _session.ObjectChangedError(where, etag, None, e) from e
        raise
    found = answer.get("ETag")
    if found is not None and found != etag:
        raise _session.ObjectChangedError(where, etag, found)
    return answer


def read_header(client: Any, Bucket: str, Key: str) -> Header:
    """The header of the safetensors object, by ranged GETs (one, unless
    the header is longer than 64 KiB, then a second one at the first's
    version), with the object's ETag (``Header.etag``)."""
    where = f"GET {Bucket}/{Key}"
    answer = client.get_object(Bucket=Bucket, Key=Key, Range=f"bytes=0-{_FIRST - 1}")
    etag = answer.get("ETag")
    raw = answer["Body"].read()
    size = None
    content_range = answer.get("ContentRange") or ""
    if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
        size = int(content_range.rsplit("/", 1)[1])
    elif len(raw) < _FIRST:
        size = len(raw)
    if len(raw) >= 8:
        (n,) = struct.unpack("<Q", raw[:8])
        if 8 + n > len(raw) and n <= MAX_HEADER:
            more = _pinned_get(client, where, etag, Bucket=Bucket, Key=Key, Range=f"bytes={len(raw)}-{8 + n - 1}")
            raw += more["Body"].read()
    try:
        return dataclasses.replace(parse_header(raw, size), etag=etag)
    except FormatError as e:
        raise FormatError(f"{where}: not a safetensors file: {e}") from None


@dataclass
class _Pending:
    header: Header
    buffer: Any
    futures: List[Any]
    #: Registered here (else each span registers, or falls back).
    registered: bool


def _start(
    session: _session.Session,
    client: Any,
    Bucket: str,
    Key: str,
    header: Header,
    framework: str,
    device: Optional[str],
    span: int,
    verify: Optional[bool],
) -> _Pending:
    """Allocates and registers the file's buffer and puts its spans in
    flight, each at the header's version."""
    buffer = _allocate(framework, device, max(header.data_len, 1))
    futures = []
    registered = False
    if header.data_len > 0 and session.available:
        try:
            session.register(buffer)
            registered = True
        except (_session.HipObjError, TypeError):
            pass  # each span registers, or falls back and says why
    pin = {"IfMatch": header.etag} if header.etag is not None else {}
    if header.data_len > 0:
        for begin in range(0, header.data_len, span):
            end = min(begin + span, header.data_len)
            first, last = header.data_start + begin, header.data_start + end - 1
            futures.append(
                session.get_object_async(
                    client, Bucket, Key, buffer, Range=f"bytes={first}-{last}", offset=begin, verify=verify, **pin
                )
            )
    return _Pending(header, buffer, futures, registered)


def _finish(session: _session.Session, pending: List[_Pending], framework: str) -> List[Dict[str, Any]]:
    """Waits for every span (all end before the first failure is raised)
    and makes the tensors."""
    try:
        _session._gather([f for p in pending for f in p.futures], False)
    finally:
        for p in pending:
            if p.registered:
                session.release(p.buffer)
    return [{t.name: _view(framework, p.buffer, t) for t in p.header.tensors} for p in pending]


def _loading(session: Optional[_session.Session], span: int) -> _session.Session:
    """The session a load uses (the active one by default), once its
    `span` is checked: both loads refuse a bad one before any request."""
    if span < 1:
        raise ValueError("span is a number of bytes: 1 or more")
    return _session_of(session)


def _load(
    session: _session.Session,
    client: Any,
    Bucket: str,
    files: List[Tuple[str, Header]],
    framework: str,
    device: Optional[str],
    span: int,
    verify: Optional[bool],
) -> List[Dict[str, Any]]:
    """The tensors of each file (its key and the header read first), every
    file's spans in flight together."""
    pending = [_start(session, client, Bucket, key, header, framework, device, span, verify) for key, header in files]
    return _finish(session, pending, framework)


def load(
    client: Any,
    Bucket: str,
    Key: str,
    *,
    framework: str = "numpy",
    device: Optional[str] = None,
    session: Optional[_session.Session] = None,
    span: int = 16 << 20,
    verify: Optional[bool] = None,
) -> Dict[str, Any]:
    """The tensors of the safetensors object `Bucket`/`Key`, by name, in
    `framework`'s memory on `device`; the file's ``__metadata__`` is
    ``metadata(client, Bucket, Key)``. `session`: the active one by
    default. Every byte is of the version whose header was read first:
    an object replaced during the load raises ``ObjectChangedError``
    (once every span in flight has ended)."""
    session = _loading(session, span)
    header = read_header(client, Bucket, Key)
    return _load(session, client, Bucket, [(Key, header)], framework, device, span, verify)[0]


def metadata(client: Any, Bucket: str, Key: str) -> Dict[str, str]:
    """The safetensors object's ``__metadata__``."""
    return read_header(client, Bucket, Key).metadata


def load_sharded(
    client: Any,
    Bucket: str,
    IndexKey: str,
    *,
    framework: str = "numpy",
    device: Optional[str] = None,
    session: Optional[_session.Session] = None,
    span: int = 16 << 20,
    verify: Optional[bool] = None,
) -> Dict[str, Any]:
    """The tensors of a sharded model, by its index
    (``model.safetensors.index.json``: ``weight_map`` names each tensor's
    shard, beside the index): every shard's spans in flight together.
    Every tensor the index names must be in its shard. Each shard is read
    at the version whose header was read first, as ``load`` reads a file
    (the index itself is read once)."""
    session = _loading(session, span)
    where = f"GET {Bucket}/{IndexKey}"
    try:
        index = json.loads(client.get_object(Bucket=Bucket, Key=IndexKey)["Body"].read())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not a map")
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{where}: not a sharded model's index: {e!r}") from None
    folder = posixpath.dirname(IndexKey)
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or "/" in shard or shard in ("", ".", ".."):
            raise FormatError(f"{where}: {shard!r} is not a file beside the index")
    keys = [posixpath.join(folder, shard) if folder else shard for shard in shards]
    headers = [read_header(client, Bucket, key) for key in keys]
    for shard, header in zip(shards, headers):
        names = {t.name for t in header.tensors}
        missing = [n for n, s in weight_map.items() if s == shard and n not in names]
        if missing:
            raise FormatError(f"{where}: {shard} has no {', '.join(sorted(missing)[:5])}")
    tensors: Dict[str, Any] = {}
    loads = _load(session, client, Bucket, list(zip(keys, headers)), framework, device, span, verify)
    for shard, loaded in zip(shards, loads):
        for name, tensor in loaded.items():
            if weight_map.get(name, shard) == shard:
                tensors[name] = tensor
    return tensors


# ---------------------------------------------------------------- saving


def _layout(tensors: Mapping[str, Any], metadata: Optional[Mapping[str, str]]) -> Tuple[bytes, List[Tuple[str, Any, int]]]:
    """The header's bytes (its length first, padded with spaces to a
    multiple of 8) and each tensor's name, flat bytes and offset in the
    data: largest items first, then by name."""
    entries = []
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names are strings, not {name!r}")
        st = _dtype_name(tensor)
        entries.append((name, st, tuple(int(d) for d in tensor.shape), tensor))
    entries.sort(key=lambda e: (-ITEMSIZE[e[1]], e[0]))
    header: Dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata maps strings to strings")
        header["__metadata__"] = dict(metadata)
    placed = []
    at = 0
    for name, st, shape, tensor in entries:
        _, flat, _ = _bytes_of(tensor)
        n = int(flat.shape[0])
        header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [at, at + n]}
        placed.append((name, flat, at))
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, placed


def save(
    client: Any,
    tensors: Mapping[str, Any],
    Bucket: str,
    Key: str,
    *,
    metadata: Optional[Mapping[str, str]] = None,
    session: Optional[_session.Session] = None,
    part_size: int = 64 << 20,
    jobs: int = 4,
    verify: Optional[bool] = None,
) -> _session.Transfer:
    """Stores `tensors` (a state dict: NumPy arrays, PyTorch tensors on one
    device, or CuPy arrays) as the safetensors object `Bucket`/`Key`, with
    `metadata` as its ``__metadata__``: laid out in one buffer on their
    device, then uploaded in `part_size` parts read by RDMA, `jobs` at
    once. What the upload did."""
    session = _session_of(session)
    head, placed = _layout(tensors, metadata)
    kinds = {_bytes_of(t)[0] for t in tensors.values()} or {"numpy"}
    if len(kinds) > 1:
        raise TypeError(f"tensors of one framework at a time, not {sorted(kinds)}")
    (framework,) = kinds
    devices = {str(flat.device) for _, flat, _ in placed} if framework == "torch" else {None}
    if len(devices) > 1:
        raise ValueError(f"tensors on one device at a time, not {sorted(devices)}")
    device = devices.pop() if devices else None
    data_len = sum(int(flat.shape[0]) for _, flat, _ in placed)
    total = len(head) + data_len
    out = _allocate(framework, device if framework == "torch" else None, total)
    if framework == "torch":
        torch = _torch()
        out[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
    elif framework == "cupy":
        out[: len(head)] = _cupy().asarray(bytearray(head), dtype="uint8")
    else:
        out[: len(head)] = _numpy().frombuffer(head, dtype="uint8")
    for _, flat, at in placed:
        n = int(flat.shape[0])
        if n:
            start = len(head) + at
            if framework == "torch":
                out[start : start + n].copy_(flat)
            else:
                out[start : start + n] = flat
    return session.upload(client, Bucket, Key, out, part_size=part_size, jobs=jobs, verify=verify)
