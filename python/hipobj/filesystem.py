"""``hipobj://bucket/key`` as an fsspec filesystem: pandas, pyarrow, Dask
and anything else that opens files through fsspec read and write S3 objects
through hipobj, by RDMA into host memory where the library initializes, over
plain HTTP (boto3) otherwise.

    import pandas

    options = {"endpoint_url": "http://s3.example:9000", "key": "AK", "secret": "SK"}
    frame = pandas.read_parquet("hipobj://data/table.parquet", storage_options=options)

The package registers the protocol with fsspec (the ``fsspec.specs`` entry
point), so ``fsspec.filesystem("hipobj", ...)`` and ``fsspec.open(
"hipobj://...")`` find this class once ``hipobj[fsspec]`` is installed.

What moves the bytes: every GET of a range (a file's blocks, ``cat_file``,
``cat_ranges``) and every PUT or part (``pipe_file``, a file written) goes
through the process's ``hipobj.Session`` (the one open, else one opened
here with the filesystem's ``nic`` and ``session_options``): by RDMA where
the library initializes and the server takes the token, else by the plain
HTTP request of the same call. Listings, HEADs and deletes are plain S3
requests of the filesystem's boto3 client. Why the bytes go over HTTP is
said once per process and reason (a ``logging`` warning on the logger
``hipobj.filesystem``), and kept as ``fs.http_reason``; ``fs.stats`` counts
what went which way.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import errno
import io
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

try:
    from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
except ImportError as _missing:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"hipobj.filesystem needs fsspec ({_missing}): pip install 'hipobj[fsspec]'"
    ) from _missing

from . import _buffers, _checksums, _session
from ._session import MIN_PART, ObjectChangedError, Session, Transfer, TransferError

__all__ = ["HipObjFileSystem", "HipObjFile", "FileSystemStats", "ObjectReplacedError"]

log = logging.getLogger("hipobj.filesystem")

#: S3 error codes that mean "no such object or bucket", and "not allowed".
_MISSING = {"404", "NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}

#: The reasons already said in this process (each once).
_said: set = set()
_said_lock = threading.Lock()
#: Held while the process's session is looked for or opened.
_opened_lock = threading.Lock()


class ObjectReplacedError(OSError):
    """A file opened for reading whose object was replaced before a later
    read (its ETag is no longer the one seen at open): its bytes would mix
    two versions. ``etag`` is the version opened; open it again to read the
    new one."""

    def __init__(self, text: str, etag: Optional[str]):
        super().__init__(errno.ESTALE, text)
        self.etag = etag


class _Landing(bytearray):
    """The buffer a GET lands in: a ``bytearray`` that takes weak
    references, so that the session keeps its registration (its cache of
    the registrations used last, ``Session(registration_cache=16)``) while
    the pool keeps it alive, and drops it when it dies."""


class _Landings:
    """GET buffers kept between requests, so that a filesystem reading many
    ranges registers a few buffers once instead of one per request: at
    most `count` buffers and `limit` bytes kept; buffers are powers of two
    from 1 MiB (a request past `limit` gets one of its own length, not
    kept), a request takes the smallest free one that fits."""

    SMALLEST = 1 << 20

    def __init__(self, count: int, limit: int):
        self.count = count
        self.limit = limit
        self._free: List[_Landing] = []
        self._lock = threading.Lock()

    def take(self, length: int) -> _Landing:
        with self._lock:
            fits = [b for b in self._free if len(b) >= length]
            if fits:
                best = min(fits, key=len)
                self._free.remove(best)
                return best
        size = max(self.SMALLEST, 1 << (length - 1).bit_length())
        # One larger than the pool keeps is for this request only: no more
        # than it needs.
        return _Landing(size if size <= self.limit else length)

    def give(self, buffer: _Landing) -> None:
        """Keeps `buffer` for a later request, if there is room; else lets
        it go (its registration goes with it)."""
        with self._lock:
            kept = sum(len(b) for b in self._free)
            if len(self._free) < self.count and kept + len(buffer) <= self.limit:
                self._free.append(buffer)


@dataclass
class FileSystemStats:
    """What the filesystem moved, and how: each GET of a range and each PUT
    or part is one request, by RDMA or by plain HTTP (a fallback included).
    Listings, HEADs and deletes are not counted."""

    #: GETs of object bytes, and the bytes they returned.
    reads: int = 0
    read_bytes: int = 0
    #: PUTs and parts, and the bytes they stored.
    writes: int = 0
    write_bytes: int = 0
    #: Of those, by RDMA.
    rdma: int = 0
    rdma_bytes: int = 0
    #: Of those, over plain HTTP.
    http: int = 0
    http_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, write: bool, path: str, nbytes: int, requests: int = 1) -> None:
        with self._lock:
            if write:
                self.writes += requests
                self.write_bytes += nbytes
            else:
                self.reads += requests
                self.read_bytes += nbytes
            if path == "rdma":
                self.rdma += requests
                self.rdma_bytes += nbytes
            else:
                self.http += requests
                self.http_bytes += nbytes

    def as_dict(self) -> Dict[str, int]:
        """The counters now, as a plain dict (a snapshot to compare)."""
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


#: botocore's data loader, one per process (``_boto_session``).
_loader: Any = None
_loader_lock = threading.Lock()


def _boto_session(**credentials: Any) -> boto3.session.Session:
    """A boto3 session of its own (its credentials, region and profile are
    this filesystem's) that shares the process's botocore data loader. A
    loader finds the service models by listing its data directories, some
    thousand ``stat`` calls made once per loader: a few tens of
    milliseconds on a local disk, tens of seconds on a slow file system
    (a network mount, a VM's shared root); one loader for every filesystem
    of the process pays that once."""
    core = botocore.session.get_session()
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=core, **credentials)


def _shared_session(nic: Optional[str], options: Dict[str, Any]) -> Session:
    """The process's open ``hipobj.Session`` (the C library has one
    instance per process: a session the application opened is used as it
    is), else one opened now with `nic` and `options`, closed at exit. A
    session that could not initialize the library is kept too (its
    ``reason`` says why), so the library is not tried again per call."""
    with _opened_lock:
        current = _session._active
        if current is not None:
            return current
        session = Session(nic=nic, **options)
        atexit.register(session.close)
        return session


def _s3_detail(error: BaseException) -> Tuple[Optional[str], Optional[int], str]:
    """The S3 error code, HTTP status and words of what boto3 or the session
    raised."""
    if isinstance(error, TransferError):
        return error.s3_code, error.http_status, str(error)
    if isinstance(error, ClientError):
        detail = error.response.get("Error", {}) or {}
        code = detail.get("Code")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code, status, str(detail.get("Message") or error)
    return None, None, f"{type(error).__name__}: {error}"


class HipObjFileSystem(AbstractFileSystem):
    """S3 through hipobj, as fsspec's protocol ``hipobj``: paths are
    ``bucket/key`` (``hipobj://bucket/key``), directories the prefixes of
    keys up to a ``/``, as s3fs has them.

    Storage options (the S3 ones named as s3fs names them):

    - `endpoint_url`, `key`, `secret`, `token`, `region`, `profile`: the
      S3 endpoint and credentials. Those not given come from where boto3
      finds them: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``,
      ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
      ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, the
      shared config and credentials files. fsspec adds
      ``FSSPEC_HIPOBJ_<OPTION>`` environment variables of its own.
    - `client_kwargs`: more arguments of ``boto3.client("s3", ...)``;
      `config_kwargs`: of its ``botocore.config.Config``.
    - `nic`, `session_options`: ``hipobj.Session(nic=..., **session_options)``
      when this filesystem opens the process's session (an open one is
      used as it is); `session`: a session to use instead; `rdma=False`:
      no session at all, every transfer over plain HTTP.
    - `block_size`: a file's read-ahead block and its write parts (16 MiB;
      parts are at least 5 MiB, S3's smallest); `max_concurrency`: the
      requests ``cat_ranges`` keeps in flight together (16).
    """

    protocol = ("hipobj",)
    root_marker = ""
    #: A file's read-ahead block, and the part size of a multipart upload.
    default_block_size = 16 << 20

    def __init__(
        self,
        endpoint_url: Optional[str] = None,
        key: Optional[str] = None,
        secret: Optional[str] = None,
        token: Optional[str] = None,
        region: Optional[str] = None,
        profile: Optional[str] = None,
        client_kwargs: Optional[Dict[str, Any]] = None,
        config_kwargs: Optional[Dict[str, Any]] = None,
        nic: Optional[str] = None,
        session_options: Optional[Dict[str, Any]] = None,
        session: Optional[Session] = None,
        rdma: bool = True,
        block_size: Optional[int] = None,
        max_concurrency: int = 16,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if max_concurrency < 1:
            raise ValueError("max_concurrency is a count: 1 or more")
        if block_size is not None and block_size < 1:
            raise ValueError("block_size is a size in bytes: 1 or more")
        self.block_size = block_size or self.default_block_size
        self.max_concurrency = max_concurrency
        self.rdma_enabled = rdma
        self._nic = nic
        self._session_options = dict(session_options or {})
        self._given_session = session
        #: Why bytes went over plain HTTP (the last reason seen); ``None``
        #: while every transfer has gone by RDMA.
        self.http_reason: Optional[str] = None if rdma else "rdma=False: no hipobj session"
        self.stats = FileSystemStats()
        # Registered buffers kept between GETs: as many as the session's
        # registration cache holds by default (16), 64 MiB at most.
        self._landings = _Landings(count=16, limit=64 << 20)
        arguments = dict(client_kwargs or {})
        if endpoint_url is not None:
            arguments["endpoint_url"] = endpoint_url
        config = dict(config_kwargs or {})
        # Enough pooled connections for the requests kept in flight.
        config.setdefault("max_pool_connections", max(10, max_concurrency))
        boto = _boto_session(
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            aws_session_token=token,
            region_name=region,
            profile_name=profile,
        )
        self.client = boto.client("s3", config=Config(**config), **arguments)
        self.endpoint_url: str = self.client.meta.endpoint_url

    # ------------------------------------------------------------ RDMA or HTTP

    @property
    def session(self) -> Optional[Session]:
        """The ``hipobj.Session`` transfers go through (opened at first use),
        or ``None`` with ``rdma=False``. Where it is not available, its
        ``reason`` says why, once, and becomes ``http_reason``."""
        if not self.rdma_enabled:
            return None
        session = self._given_session or _shared_session(self._nic, self._session_options)
        if not session.available:
            self._over_http(session.reason or "the hipobj session is not available")
        return session

    @property
    def rdma(self) -> bool:
        """Whether transfers can go by RDMA now (the session initialized the
        library); the server may still decline a transfer, which then goes
        over HTTP and says so."""
        session = self.session
        return session is not None and session.available

    def _over_http(self, reason: Optional[str]) -> None:
        """Records that bytes go over plain HTTP and why; says it once per
        process and reason."""
        reason = reason or "unknown"
        self.http_reason = reason
        with _said_lock:
            if reason in _said:
                return
            _said.add(reason)
        log.warning("hipobj:// transfers go over plain HTTP (boto3), not RDMA: %s", reason)

    def _counted(self, write: bool, t: Transfer) -> None:
        self.stats.count(write, t.path, t.bytes, max(1, t.parts))
        if t.path != "rdma":
            self._over_http(t.reason)

    # ------------------------------------------------------------ errors

    def _error(self, error: BaseException, path: str, what: str) -> OSError:
        """`error` (boto3's or the session's) as s3fs raises it: a missing
        object or bucket ``FileNotFoundError``, a refusal
        ``PermissionError``, an object replaced during a read
        ``ObjectReplacedError``, anything else ``OSError``; the
        message names the path, the request, the S3 status and the
        endpoint."""
        code, status, words = _s3_detail(error)
        s3 = f"S3 {code or 'error'}" + (f" (HTTP {status})" if status else "")
        text = f"hipobj://{path}: {what} at {self.endpoint_url}: {s3}: {words}"
        if isinstance(error, ObjectChangedError):
            return ObjectReplacedError(f"{text} (open the file again to read the new version)", error.expected)
        if status == 404 or code in _MISSING:
            return FileNotFoundError(errno.ENOENT, text)
        if status == 403 or code in _DENIED:
            return PermissionError(errno.EACCES, text)
        return OSError(errno.EIO, text)

    def _call(self, path: str, what: str, fn: Any, **kwargs: Any) -> Any:
        """A boto3 call, its errors as ``_error`` maps them."""
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, path, what) from e

    # ------------------------------------------------------------ paths

    def split_path(self, path: str) -> Tuple[str, str]:
        """``bucket/key`` (any ``hipobj://`` first) as (bucket, key)."""
        path = self._strip_protocol(path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key

    def _need_key(self, path: str) -> Tuple[str, str]:
        bucket, key = self.split_path(path)
        if not bucket or not key:
            raise IsADirectoryError(errno.EISDIR, f"hipobj://{path}: a bucket, not an object (bucket/key)")
        return bucket, key

    @staticmethod
    def _file(name: str, size: int, etag: Optional[str], modified: Any) -> Dict[str, Any]:
        return {"name": name, "size": int(size), "type": "file", "ETag": etag, "LastModified": modified}

    @staticmethod
    def _directory(name: str) -> Dict[str, Any]:
        return {"name": name, "size": 0, "type": "directory"}

    # ------------------------------------------------------------ listing

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> List[Any]:
        """The entries under `path`: buckets at the root, else the objects
        and the prefixes (as directories) one ``/`` deeper (ListObjectsV2
        with ``Delimiter="/"``); a path that is an object lists itself."""
        path = self._strip_protocol(path).strip("/")
        if not path:
            buckets = self._call("", "ListBuckets", self.client.list_buckets).get("Buckets", [])
            entries = [self._directory(b["Name"]) for b in buckets]
        else:
            bucket, key = self.split_path(path)
            prefix = f"{key}/" if key else ""
            entries = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, Delimiter="/"
            )
            try:
                for page in pages:
                    for common in page.get("CommonPrefixes", []) or []:
                        entries.append(self._directory(f"{bucket}/{common['Prefix'].rstrip('/')}"))
                    for obj in page.get("Contents", []) or []:
                        if obj["Key"] == prefix:
                            continue  # a directory marker ("a/"), made by some tools
                        entries.append(
                            self._file(f"{bucket}/{obj['Key']}", obj["Size"], obj.get("ETag"), obj.get("LastModified"))
                        )
            except (ClientError, BotoCoreError) as e:
                raise self._error(e, path, "ListObjectsV2") from e
            if not entries and key:
                entry = self.info(path)
                if entry["type"] == "file":
                    entries = [entry]
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        """An object's size, ETag and LastModified (HeadObject); a bucket, or
        a prefix of keys, as a directory; else ``FileNotFoundError``."""
        path = self._strip_protocol(path).strip("/")
        if not path:
            return self._directory("")
        bucket, key = self.split_path(path)
        if not key:
            self._call(path, "HeadBucket", self.client.head_bucket, Bucket=bucket)
            return self._directory(bucket)
        try:
            head = self.client.head_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as e:
            missing = self._error(e, path, "HeadObject")
            # A key that is only a prefix of others is a directory: S3
            # answers its HEAD 404; hipobj-s3-server's local backend, whose
            # keys are files, 500 (the path is a folder there). Either way
            # the listing says; a refusal is raised as it is.
            if isinstance(missing, PermissionError):
                raise missing from e
            listed = self._call(
                path, "ListObjectsV2", self.client.list_objects_v2, Bucket=bucket, Prefix=f"{key}/", MaxKeys=1
            )
            if listed.get("KeyCount", 0) or listed.get("Contents") or listed.get("CommonPrefixes"):
                return self._directory(path)
            raise missing from e
        return self._file(path, head["ContentLength"], head.get("ETag"), head.get("LastModified"))

    def modified(self, path: str) -> Any:
        """An object's LastModified (a ``datetime``)."""
        entry = self.info(path)
        if entry["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, f"hipobj://{path}: a directory has no modification time")
        return entry["LastModified"]

    def ukey(self, path: str) -> str:
        """An object's ETag: it changes when the object does."""
        return str(self.info(path).get("ETag"))

    # Object stores have no directories: a prefix exists while keys under
    # it do. Making or removing one does nothing.
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing: a directory is a prefix of keys, there once a key is."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Nothing: a directory is a prefix of keys, there once a key is."""

    def rmdir(self, path: str) -> None:
        """Nothing: a directory is a prefix of keys, gone with its last key."""

    def rm_file(self, path: str) -> None:
        """Deletes the object (DeleteObject); a bucket or prefix is left."""
        bucket, key = self.split_path(path)
        if not key:
            return
        self._call(path, "DeleteObject", self.client.delete_object, Bucket=bucket, Key=key)

    _rm = rm_file

    def rm(self, path: Union[str, List[str]], recursive: bool = False, maxdepth: Optional[int] = None) -> None:
        """Deletes the objects `path` names (a path, a list, a glob; with
        `recursive`, every object under a directory). A directory is a
        prefix of the others named: no request of its own, it goes with
        its last object."""
        names = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        prefixes = {name.rsplit("/", 1)[0] for name in names if "/" in name}
        for name in reversed(names):
            if name not in prefixes:
                self.rm_file(name)

    # ------------------------------------------------------------ bytes

    def _get(self, path: str, start: int, length: int, etag: Optional[str] = None) -> bytes:
        """`length` bytes of the object at `path` from `start` (all inside
        it): one ranged GET, by RDMA into host memory through the session,
        else over HTTP. With `etag`, pinned to that version (``IfMatch``)."""
        if length <= 0:
            return b""
        bucket, key = self._need_key(path)
        asked = f"bytes={start}-{start + length - 1}"
        pinned = {"IfMatch": etag} if etag else {}
        session = self.session
        if session is not None and session.available:
            # Into a kept buffer (registered once, while it is kept), then
            # copied into the bytes fsspec hands back; the buffer is kept
            # again only after a transfer that ended well.
            into = self._landings.take(length)
            try:
                t = session.get_object(self.client, Bucket=bucket, Key=key, into=into, Range=asked, **pinned)
            except TransferError as e:
                raise self._error(e, path, "GetObject") from e
            self._counted(False, t)
            with memoryview(into) as landed:
                data = bytes(landed[:length])
            self._landings.give(into)
            return data
        try:
            response = self.client.get_object(Bucket=bucket, Key=key, Range=asked, **pinned)
            body = response["Body"].read()
        except (ClientError, BotoCoreError) as e:
            if etag and isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") == "PreconditionFailed":
                raise self._error(ObjectChangedError(f"GET {bucket}/{key}", etag, None, e), path, "GetObject") from e
            raise self._error(e, path, "GetObject") from e
        if len(body) != length:
            raise OSError(
                errno.EIO,
                f"hipobj://{path}: GetObject {asked} at {self.endpoint_url}: {len(body)} bytes came, {length} were asked for",
            )
        self.stats.count(False, "http", length)
        return body

    def _span(self, size: int, start: Optional[int], end: Optional[int]) -> Tuple[int, int]:
        """fsspec's (start, end) of an object of `size` bytes (None: its
        edge; negative: from its end, as Python slices) as (first, length)."""
        first = 0 if start is None else (start if start >= 0 else max(0, size + start))
        last = size if end is None else (end if end >= 0 else size + end)
        first, last = min(first, size), min(last, size)
        return first, max(0, last - first)

    def _object(self, path: str) -> Dict[str, Any]:
        entry = self.info(path)
        if entry["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, f"hipobj://{path}: a directory, not an object")
        return entry

    def cat_file(self, path: str, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        """The object's bytes from `start` to `end` (fsspec's slice rules):
        its size and ETag by a HEAD, then one ranged GET pinned to that
        version."""
        path = self._strip_protocol(path)
        entry = self._object(path)
        first, length = self._span(entry["size"], start, end)
        return self._get(path, first, length, entry.get("ETag"))

    def cat_ranges(
        self,
        paths: List[str],
        starts: Union[int, None, List[Optional[int]]],
        ends: Union[int, None, List[Optional[int]]],
        max_gap: Optional[int] = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> List[Any]:
        """Many ranges at once: each distinct path's HEAD, then every range's
        GET, `max_concurrency` in flight together (by RDMA each into its own
        buffer, or over HTTP). Results in the order asked; a failing range
        is its exception in its place (``on_error="return"``), or raised
        once all have ended. `max_gap` (merging near ranges) is not
        supported."""
        if max_gap is not None:
            raise NotImplementedError("max_gap: ranges are fetched as asked, each by its own request")
        if not isinstance(paths, list):
            raise TypeError("paths is a list")
        starts_list = starts if isinstance(starts, list) else [starts] * len(paths)
        ends_list = ends if isinstance(ends, list) else [ends] * len(paths)
        if len(starts_list) != len(paths) or len(ends_list) != len(paths):
            raise ValueError("paths, starts and ends are lists of one length")
        names = [self._strip_protocol(p) for p in paths]
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="hipobj-fsspec"
        ) as pool:
            heads = {name: pool.submit(self._object, name) for name in dict.fromkeys(names)}

            def one(i: int) -> bytes:
                entry = heads[names[i]].result()
                first, length = self._span(entry["size"], starts_list[i], ends_list[i])
                return self._get(names[i], first, length, entry.get("ETag"))

            futures = [pool.submit(one, i) for i in range(len(names))]
            results: List[Any] = []
            for future in futures:
                try:
                    results.append(future.result())
                except Exception as e:  # noqa: BLE001 - each range's own error, kept in its place
                    results.append(e)
        if on_error != "return":
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results

    def _put(self, path: str, data: bytes) -> None:
        """One PutObject of `data`, carrying its CRC-64/NVME."""
        bucket, key = self._need_key(path)
        session = self.session
        if session is not None and session.available:
            try:
                t = session.put_object(self.client, Bucket=bucket, Key=key, source=data)
            except TransferError as e:
                raise self._error(e, path, "PutObject") from e
            self._counted(True, t)
            return
        crc = _checksums.encode(_checksums.crc64nvme(data))
        self._call(path, "PutObject", self.client.put_object, Bucket=bucket, Key=key, Body=data, ChecksumCRC64NVME=crc)
        self.stats.count(True, "http", len(data))

    def _put_part(self, path: str, upload_id: str, number: int, data: bytes) -> Tuple[Optional[str], int]:
        """One UploadPart: its ETag and the CRC-64/NVME it carried."""
        bucket, key = self._need_key(path)
        session = self.session
        if session is not None and session.available:
            view = _buffers.view_of(data, writable=False)
            try:
                t, etag, crc = session._put(
                    self.client, bucket, key, data, view, 0, len(data), False, (upload_id, number), {}
                )
            except TransferError as e:
                raise self._error(e, path, f"UploadPart {number}") from e
            self._counted(True, t)
            assert crc is not None  # host memory, verified: the session computed it
            return etag, crc
        crc = _checksums.crc64nvme(data)
        response = self._call(
            path,
            f"UploadPart {number}",
            self.client.upload_part,
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
            ChecksumCRC64NVME=_checksums.encode(crc),
        )
        self.stats.count(True, "http", len(data))
        return response.get("ETag"), crc

    # ------------------------------------------------------------ files

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> "HipObjFile":
        return HipObjFile(
            self, path, mode, block_size=block_size, autocommit=autocommit, cache_options=cache_options, **kwargs
        )


class HipObjFile(AbstractBufferedFile):
    """An object opened through ``HipObjFileSystem.open``.

    Reading (``"rb"``): its size and ETag from a HEAD at open, then blocks
    fetched by ranged GETs as reads and seeks reach them (fsspec's
    ``readahead`` cache by default), each pinned to the ETag seen at open,
    so an object replaced meanwhile raises ``ObjectReplacedError`` rather than
    mixing two versions.

    Writing (``"wb"``, ``"xb"``): bytes are kept until the file closes and
    stored by one PutObject; once `block_size` bytes (at least 5 MiB) are
    kept, a multipart upload starts and parts of that size leave as they
    fill (bounded memory), the rest at close. The upload is created as
    ``CRC64NVME`` ``FULL_OBJECT``: each part carries its CRC and the
    completion the whole object's, which the server checks. A failure
    aborts it. S3 has no append: ``"ab"`` is refused."""

    def __init__(
        self,
        fs: HipObjFileSystem,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_type: str = "readahead",
        cache_options: Optional[Dict[str, Any]] = None,
        size: Optional[int] = None,
        **kwargs: Any,
    ):
        if mode not in ("rb", "wb", "xb"):
            raise ValueError(f"hipobj://{path}: mode {mode!r}: objects are read (rb) or written whole (wb, xb)")
        if not autocommit:
            raise NotImplementedError(f"hipobj://{path}: autocommit=False (transactions) is not supported")
        fs._need_key(path)
        if mode == "xb" and fs.exists(path):
            raise FileExistsError(errno.EEXIST, f"hipobj://{path}: the object exists (mode xb)")
        block_size = fs.block_size if block_size in (None, "default") else int(block_size)
        if mode != "rb":
            block_size = max(block_size, MIN_PART)
        self.upload_id: Optional[str] = None
        self.parts: List[Dict[str, Any]] = []
        self._whole = 0
        super().__init__(
            fs,
            path,
            mode="wb" if mode == "xb" else mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_type=cache_type,
            cache_options=cache_options,
            size=size,
            **kwargs,
        )
        #: The version read (``None`` when opened with a size and no HEAD).
        self.etag: Optional[str] = self._details.get("ETag") if mode == "rb" and self._details else None

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        return self.fs._get(self.path, start, max(0, end - start), self.etag)

    def _initiate_upload(self) -> None:
        """Nothing yet: the multipart upload starts with its first full
        part (a small file is one PutObject at close)."""

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getvalue()
        try:
            if final and self.upload_id is None:
                self.fs._put(self.path, data)
                return True
            sent = 0
            while len(data) - sent >= self.blocksize or (final and sent < len(data)):
                n = min(self.blocksize, len(data) - sent)
                self._send_part(data[sent : sent + n])
                sent += n
            if final:
                self._complete()
                return True
        except BaseException:
            self.discard()
            raise
        # Keep what does not fill a part for the next one.
        self.buffer = io.BytesIO()
        self.buffer.write(data[sent:])
        self.offset = (self.offset or 0) + sent
        return False

    def _send_part(self, data: bytes) -> None:
        if self.upload_id is None:
            bucket, key = self.fs._need_key(self.path)
            self.upload_id = self.fs._call(
                self.path,
                "CreateMultipartUpload",
                self.fs.client.create_multipart_upload,
                Bucket=bucket,
                Key=key,
                ChecksumAlgorithm="CRC64NVME",
                ChecksumType="FULL_OBJECT",
            )["UploadId"]
        number = len(self.parts) + 1
        etag, crc = self.fs._put_part(self.path, self.upload_id, number, data)
        self.parts.append({"PartNumber": number, "ETag": etag, "ChecksumCRC64NVME": _checksums.encode(crc)})
        self._whole = _checksums.combine(self._whole, crc, len(data))

    def _complete(self) -> None:
        bucket, key = self.fs._need_key(self.path)
        self.fs._call(
            self.path,
            "CompleteMultipartUpload",
            self.fs.client.complete_multipart_upload,
            Bucket=bucket,
            Key=key,
            UploadId=self.upload_id,
            MultipartUpload={"Parts": self.parts},
            ChecksumCRC64NVME=_checksums.encode(self._whole),
            ChecksumType="FULL_OBJECT",
        )
        self.upload_id = None

    def discard(self) -> None:
        """Aborts the multipart upload in progress, if any: nothing is
        stored."""
        upload_id, self.upload_id = self.upload_id, None
        if upload_id is not None:
            bucket, key = self.fs._need_key(self.path)
            try:
                self.fs.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            except (ClientError, BotoCoreError) as e:
                log.warning("hipobj://%s: aborting multipart upload %s failed: %s", self.path, upload_id, e)
