"""The names of the Amazon S3 Connector for PyTorch (``s3torchconnector``),
over hipobj: switching is an import.

    # from s3torchconnector import S3Checkpoint, S3MapDataset, S3IterableDataset
    from hipobj.s3torchconnector import S3Checkpoint, S3MapDataset, S3IterableDataset
    # from s3torchconnector.dcp import S3StorageWriter, S3StorageReader
    from hipobj.s3torchconnector.dcp import S3StorageWriter, S3StorageReader

    checkpoint = S3Checkpoint(region="us-east-1", endpoint="http://gw:9000")
    with checkpoint.writer("s3://b/model.pt") as f:
        torch.save(model.state_dict(), f)
    with checkpoint.reader("s3://b/model.pt") as f:
        state = torch.load(f)
    dataset = S3MapDataset.from_prefix("s3://b/images/", region="us-east-1", transform=decode)

The arguments are the connector's (`region`, `endpoint`, `transform`,
`s3client_config`, `enable_sharding`); each class also takes `client` (a
boto3 S3 client of your own; else one is made with `region` and `endpoint`
and boto3's usual credentials) and `session` (a ``hipobj.Session``; else
``hipobj.active()``). Objects move by RDMA into host memory where the
library runs, over plain HTTP otherwise (``Session.stats`` says which).

Differences from the connector: a reader fetches its object whole, by one
GET, at its first read (the connector's default ``SequentialS3Reader``
streams it; its ranged reader has no counterpart here), and a writer holds
what is written in memory until ``close`` uploads it (one PUT, or a
multipart upload in ``s3client_config.part_size`` parts). ``S3ClientConfig``
takes the connector's fields; `throughput_target_gbps` is accepted and not
used. Datasets derive from PyTorch's ``Dataset`` and ``IterableDataset``
where PyTorch is installed, else from ``object``.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .. import _session
from .._checkpoint_layout import parse_s3_uri

try:  # The datasets are PyTorch datasets where PyTorch is there.
    from torch.utils.data import Dataset as _MapBase
    from torch.utils.data import IterableDataset as _IterableBase
except ImportError:  # pragma: no cover - exercised where PyTorch is absent
    _MapBase = object  # type: ignore[assignment,misc]
    _IterableBase = object  # type: ignore[assignment,misc]

__all__ = [
    "S3Checkpoint",
    "S3ClientConfig",
    "S3IterableDataset",
    "S3MapDataset",
    "S3Reader",
    "S3Writer",
    "parse_s3_uri",
]


@dataclass(frozen=True)
class S3ClientConfig:
    """The connector's client settings: `part_size`, the parts of a
    writer's multipart upload (8 MiB by default, at least 5 MiB);
    `max_attempts`, botocore's retries; `throughput_target_gbps`, accepted
    for the connector's sake and not used; `force_path_style`, path-style
    addressing (the default for a custom endpoint here)."""

    throughput_target_gbps: float = 10.0
    part_size: int = 8 << 20
    force_path_style: bool = False
    max_attempts: int = 10


def identity(reader: "S3Reader") -> "S3Reader":
    """The default transform: the reader itself."""
    return reader


def make_client(region: Optional[str], endpoint: Optional[str], config: Optional[S3ClientConfig]) -> Any:
    """A boto3 S3 client for `region` at `endpoint` (``None``: AWS's, or
    ``AWS_ENDPOINT_URL``), credentials as boto3 finds them."""
    import boto3  # noqa: PLC0415 - a dependency of the package
    from botocore.config import Config  # noqa: PLC0415

    config = config or S3ClientConfig()
    addressing = {"addressing_style": "path"} if (endpoint or config.force_path_style) else {}
    return boto3.client(
        "s3",
        region_name=region,
        endpoint_url=endpoint,
        config=Config(
            s3=addressing or None,
            retries={"max_attempts": config.max_attempts, "mode": "standard"},
            max_pool_connections=64,
        ),
    )


class _Client:
    """A boto3 client made on first use in each process (a DataLoader
    worker forked from its parent makes its own, as boto3 advises), unless
    one was given."""

    def __init__(self, region: Optional[str], endpoint: Optional[str], config: Optional[S3ClientConfig], client: Any):
        self.region, self.endpoint, self.config = region, endpoint, config
        self._given = client
        self._made: Optional[Tuple[int, Any]] = None

    def get(self) -> Any:
        if self._given is not None:
            return self._given
        if self._made is None or self._made[0] != os.getpid():
            self._made = (os.getpid(), make_client(self.region, self.endpoint, self.config))
        return self._made[1]


class S3Reader(io.BufferedIOBase):
    """A read-only, seekable file over one S3 object (``torch.load`` takes
    it). The object's bytes come by one GET into host memory at the first
    read, through the session (RDMA where it runs)."""

    def __init__(self, bucket: str, key: str, client: Any, session: Optional[_session.Session] = None):
        super().__init__()
        self._bucket, self._key = bucket, key
        self._client = client
        self._session = session
        self._data: Optional[memoryview] = None
        self._position = 0
        #: What the GET did (``None`` until the first read).
        self.transfer: Optional[_session.Transfer] = None

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def key(self) -> str:
        return self._key

    def _load(self) -> memoryview:
        if self._data is None:
            session = self._session if self._session is not None else _session.active()
            where = _session._where(f"HEAD {self._bucket}/{self._key}", self._client)
            head = session._s3(where, lambda: self._client.head_object(Bucket=self._bucket, Key=self._key))
            size = int(head["ContentLength"])
            buffer = bytearray(size)
            if size:
                self.transfer = session.get_object(
                    self._client, Bucket=self._bucket, Key=self._key, into=buffer, IfMatch=head["ETag"]
                )
            self._data = memoryview(buffer)
        return self._data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: Optional[int] = -1) -> bytes:
        data = self._load()
        end = len(data) if size is None or size < 0 else min(len(data), self._position + size)
        chunk = bytes(data[self._position : end])
        self._position = max(self._position, end)
        return chunk

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self._load()
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(data) - self._position))
        out[:n] = data[self._position : self._position + n]
        self._position += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = len(self._load()) + offset
        else:
            raise ValueError(f"whence is SEEK_SET, SEEK_CUR or SEEK_END, not {whence}")
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def tell(self) -> int:
        return self._position


class S3Writer(io.BufferedIOBase):
    """A write-only file that becomes the S3 object at ``close`` (the end of
    a ``with`` block; ``torch.save`` takes it): one PUT, or a multipart
    upload of `part_size` parts, through the session (RDMA where it runs).
    An exception inside the ``with`` block uploads nothing."""

    def __init__(
        self, bucket: str, key: str, client: Any, session: Optional[_session.Session] = None, part_size: int = 8 << 20
    ):
        super().__init__()
        self.bucket, self.key = bucket, key
        self._client = client
        self._session = session
        self._part_size = part_size
        self._buffer = bytearray()
        #: What the upload did (``None`` until ``close``).
        self.transfer: Optional[_session.Transfer] = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to s3://{self.bucket}/{self.key} after it was closed")
        view = memoryview(data).cast("B")
        self._buffer += view
        return len(view)

    def tell(self) -> int:
        return len(self._buffer)

    def flush(self) -> None:
        if self.closed:
            raise ValueError(f"flush of s3://{self.bucket}/{self.key} after it was closed")

    def close(self) -> None:
        if self.closed:
            return
        try:
            session = self._session if self._session is not None else _session.active()
            if not self._buffer:
                # Nothing to move: an empty object, by a plain PUT.
                where = _session._where(f"PUT {self.bucket}/{self.key}", self._client)
                session._s3(where, lambda: self._client.put_object(Bucket=self.bucket, Key=self.key, Body=b""))
                self.transfer = _session.Transfer("fallback", 0, "an empty object")
                return
            self.transfer = session.upload(
                self._client, Bucket=self.bucket, Key=self.key, source=self._buffer, part_size=self._part_size
            )
        finally:
            self._buffer = bytearray()
            super().close()

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is not None:
            # Nothing is stored from a block that failed.
            self._buffer = bytearray()
            super().close()
            return
        self.close()


class S3Checkpoint:
    """``torch.save``/``torch.load`` to and from S3: ``writer(uri)`` and
    ``reader(uri)`` give file objects (and context managers)."""

    def __init__(
        self,
        region: Optional[str] = None,
        endpoint: Optional[str] = None,
        s3client_config: Optional[S3ClientConfig] = None,
        *,
        client: Any = None,
        session: Optional[_session.Session] = None,
    ):
        self.region, self.endpoint = region, endpoint
        self._config = s3client_config or S3ClientConfig()
        self._client = _Client(region, endpoint, self._config, client)
        self._session = session

    def reader(self, s3_uri: str) -> S3Reader:
        bucket, key = parse_s3_uri(s3_uri)
        if not key:
            raise ValueError(f"{s3_uri!r} names a bucket, not an object")
        return S3Reader(bucket, key, self._client.get(), self._session)

    def writer(self, s3_uri: str) -> S3Writer:
        bucket, key = parse_s3_uri(s3_uri)
        if not key:
            raise ValueError(f"{s3_uri!r} names a bucket, not an object")
        return S3Writer(bucket, key, self._client.get(), self._session, self._config.part_size)


def list_prefix(client: Any, s3_uri: str, page_size: Optional[int] = None) -> List[Tuple[str, str]]:
    """Every object under the prefix of `s3_uri` as ``(bucket, key)``, in
    key order (ListObjectsV2, all pages, of `page_size` keys or the
    server's); keys ending in ``/`` (folder markers) are left out."""
    bucket, prefix = parse_s3_uri(s3_uri)
    found = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": page_size} if page_size else {}
        ):
            for entry in page.get("Contents", []) or []:
                if not entry["Key"].endswith("/"):
                    found.append((bucket, entry["Key"]))
    except Exception as e:  # noqa: BLE001 - botocore's, as the package's error
        raise _session._s3_failure(_session._where(f"ListObjectsV2 {bucket}/{prefix}", client), e) from e
    return sorted(found, key=lambda bucket_key: bucket_key[1])


def _objects(object_uris: Union[str, Iterable[str]]) -> List[Tuple[str, str]]:
    uris = [object_uris] if isinstance(object_uris, str) else list(object_uris)
    out = []
    for uri in uris:
        bucket, key = parse_s3_uri(uri)
        if not key:
            raise ValueError(f"{uri!r} names a bucket, not an object")
        out.append((bucket, key))
    return out


class _Dataset:
    def __init__(
        self,
        lister: Callable[[Any], Sequence[Tuple[str, str]]],
        region: Optional[str],
        endpoint: Optional[str],
        transform: Callable[[S3Reader], Any],
        s3client_config: Optional[S3ClientConfig],
        client: Any,
        session: Optional[_session.Session],
    ):
        self._lister = lister
        self._transform = transform
        self._client = _Client(region, endpoint, s3client_config, client)
        self._session = session
        self.region, self.endpoint = region, endpoint

    @classmethod
    def from_prefix(
        cls,
        s3_uri: str,
        *,
        region: Optional[str] = None,
        endpoint: Optional[str] = None,
        transform: Callable[[S3Reader], Any] = identity,
        s3client_config: Optional[S3ClientConfig] = None,
        client: Any = None,
        session: Optional[_session.Session] = None,
        **options: Any,
    ) -> Any:
        """The objects under the prefix of `s3_uri` (listed at first use),
        in key order; `options` are the dataset's own (``enable_sharding``
        of ``S3IterableDataset``)."""
        parse_s3_uri(s3_uri)
        return cls(lambda c: list_prefix(c, s3_uri), region, endpoint, transform, s3client_config, client, session,
                   **options)

    @classmethod
    def from_objects(
        cls,
        object_uris: Union[str, Iterable[str]],
        *,
        region: Optional[str] = None,
        endpoint: Optional[str] = None,
        transform: Callable[[S3Reader], Any] = identity,
        s3client_config: Optional[S3ClientConfig] = None,
        client: Any = None,
        session: Optional[_session.Session] = None,
        **options: Any,
    ) -> Any:
        """The objects `object_uris` names, in that order; `options` as for
        ``from_prefix``."""
        objects = _objects(object_uris)
        return cls(lambda c: objects, region, endpoint, transform, s3client_config, client, session, **options)

    def _reader(self, bucket: str, key: str) -> S3Reader:
        return S3Reader(bucket, key, self._client.get(), self._session)


class S3MapDataset(_Dataset, _MapBase):  # type: ignore[misc,valid-type]
    """A map-style dataset of S3 objects: ``dataset[i]`` is
    ``transform(S3Reader of the i-th object)``, in key order."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._objects: Optional[List[Tuple[str, str]]] = None

    @property
    def objects(self) -> List[Tuple[str, str]]:
        """``(bucket, key)`` of each item."""
        if self._objects is None:
            self._objects = list(self._lister(self._client.get()))
        return self._objects

    def __len__(self) -> int:
        return len(self.objects)

    def __getitem__(self, i: int) -> Any:
        bucket, key = self.objects[i]
        return self._transform(self._reader(bucket, key))


class S3IterableDataset(_Dataset, _IterableBase):  # type: ignore[misc,valid-type]
    """An iterable dataset of S3 objects: ``transform(S3Reader)`` of each,
    in key order. With `enable_sharding`, each DataLoader worker of each
    distributed rank takes its own share (every ``n``-th object)."""

    def __init__(self, *args: Any, enable_sharding: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.enable_sharding = enable_sharding

    def _share(self) -> Tuple[int, int]:
        """(this reader's index, how many share the objects)."""
        if not self.enable_sharding:
            return 0, 1
        rank, world = 0, 1
        try:
            import torch.distributed as dist  # noqa: PLC0415 - optional
            from torch.utils.data import get_worker_info  # noqa: PLC0415
        except ImportError:
            return 0, 1
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world * workers

    def __iter__(self) -> Iterator[Any]:
        index, count = self._share()
        for i, (bucket, key) in enumerate(self._lister(self._client.get())):
            if i % count == index:
                yield self._transform(self._reader(bucket, key))
