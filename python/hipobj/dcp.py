"""PyTorch distributed checkpoints (``torch.distributed.checkpoint``) in
S3 through hipobj: a ``StorageWriter`` and a ``StorageReader`` whose
checkpoint is an S3 prefix.

    import torch.distributed.checkpoint as dcp
    from hipobj.dcp import HipObjStorageWriter, HipObjStorageReader

    dcp.save(state_dict, storage_writer=HipObjStorageWriter("s3://b/ckpt/step-100", client=s3))
    dcp.load(state_dict, storage_reader=HipObjStorageReader("s3://b/ckpt/step-100", client=s3))

Layout, as DCP's own ``FileSystemWriter`` lays a directory out: one data
object per rank, ``PREFIX/__RANK_0.distcp``, and ``PREFIX/.metadata``, the
pickled ``Metadata`` whose ``storage_data`` says where each item lies
(``StoredItem``). A tensor is stored as its raw bytes (row-major, as in
memory), not ``torch.save``'d as ``FileSystemWriter`` does, so that a load
lands them straight in the tensors the load planner gives: each item one
or more ranged GETs (``Session.get_object(into=tensor, Range=...)``), by
RDMA into GPU or host memory where the library runs, many in flight.

Saving sends each contiguous tensor of 5 MiB or more straight from its
memory (parts of a multipart upload); smaller items, non-contiguous
tensors and bytes are copied into host buffers of `buffer_part` bytes and
sent from those.

PyTorch is imported by this module (its classes derive from DCP's):
``import hipobj`` alone needs no PyTorch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import pickle
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _buffers, _checksums, _session
from ._checkpoint_layout import (
    METADATA_NAME,
    Part,
    Request,
    StoredItem,
    box_ranges,
    data_object_name,
    join_key,
    lay_out,
    parse_s3_uri,
    plan_reads,
    rank_prefix,
)

__all__ = ["HipObjStorageReader", "HipObjStorageWriter", "StoredItem"]

#: Ranges one item may be read in before the load reads whole rows of it
#: into a scratch tensor instead.
MAX_RANGES = 64


def _client(client: Any, endpoint: Optional[str] = None, region: Optional[str] = None) -> Any:
    if client is not None:
        return client
    import boto3  # noqa: PLC0415 - a dependency of the package
    from botocore.config import Config  # noqa: PLC0415

    # Enough pooled connections for every transfer in flight.
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=Config(max_pool_connections=64))


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bytes as a flat uint8 tensor over its memory (it is
    contiguous)."""
    return tensor.reshape(-1).view(torch.uint8)


def _where(uri: str) -> Tuple[str, str]:
    if isinstance(uri, (bytes, bytearray)):
        uri = uri.decode()
    return parse_s3_uri(str(uri))


def _valid(checkpoint_id: Any) -> bool:
    try:
        _where(checkpoint_id)
    except (ValueError, TypeError, UnicodeDecodeError):
        return False
    return True


class _Checkpoint:
    """What the writer and the reader share: where the checkpoint lies (an
    S3 prefix: `bucket`, `prefix`, its `uri`), the client, the session and
    `strict`."""

    def _open(self, path: Union[str, None], client: Any, session: Optional[_session.Session],
              endpoint: Optional[str], region: Optional[str], strict: bool) -> None:
        self.client = _client(client, endpoint, region)
        self.session = session
        self.strict = strict
        self.bucket = self.prefix = ""
        self.uri: Optional[str] = None
        if path is not None:
            self._place(path)

    def _place(self, checkpoint_id: Union[str, Any]) -> None:
        self.bucket, self.prefix = _where(checkpoint_id)
        self.uri = str(checkpoint_id)

    def _reset_place(self, checkpoint_id: Union[str, Any, None]) -> None:
        """``reset``'s common head: a new checkpoint id moves it there; one
        there must be."""
        if checkpoint_id is not None:
            self._place(checkpoint_id)
        if self.uri is None:
            raise ValueError("no checkpoint path: pass path= (s3://BUCKET/PREFIX) or checkpoint_id")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, Any]) -> bool:
        """Whether `checkpoint_id` is an ``s3://`` URI this writer or reader
        takes."""
        return _valid(checkpoint_id)

    def _session(self) -> _session.Session:
        return self.session if self.session is not None else _session.active()


class HipObjStorageWriter(_Checkpoint, StorageWriter):
    """DCP's ``StorageWriter`` into the S3 prefix `path` (``s3://B/P``).

    `client`: a boto3 S3 client (else one made with `endpoint` and
    `region`); `session`: a ``hipobj.Session`` (else ``hipobj.active()``);
    `thread_count`: parts in flight at once; `buffer_part`: the bytes of
    each host buffer small items are packed into; `strict`: refuse the
    plain-HTTP fallback."""

    def __init__(
        self,
        path: Union[str, None] = None,
        *,
        client: Any = None,
        session: Optional[_session.Session] = None,
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        thread_count: int = 8,
        buffer_part: int = 64 << 20,
        strict: bool = False,
    ) -> None:
        super().__init__()
        if thread_count < 1:
            raise ValueError("thread_count is 1 or more")
        self._open(path, client, session, endpoint, region, strict)
        self.thread_count = thread_count
        self.buffer_part = buffer_part
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.rank = 0

    # ---------------------------------------------------------------- DCP

    def reset(self, checkpoint_id: Union[str, Any, None] = None) -> None:
        self._reset_place(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank") or 0)
        if kwargs.get("use_collectives", True) is False:
            raise ValueError(
                "HipObjStorageWriter writes one .metadata for all ranks, from the global plan: "
                "save with collectives (use_collectives=True)"
            )

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.uri, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        """Gives each rank's plan its data object's name prefix."""
        return [dataclasses.replace(plan, storage_data=rank_prefix(i)) for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        if self.uri is None:
            raise ValueError("no checkpoint path: pass path= (s3://BUCKET/PREFIX) or checkpoint_id")
        # The global plan names each rank's object; a plan without it (a
        # single process) is this rank's.
        name = data_object_name(plan.storage_data if isinstance(plan.storage_data, str) else rank_prefix(self.rank))
        results = self._write(name, plan.items, planner)
        future: Future = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """Writes ``.metadata``: `metadata` with where each item lies."""
        storage: Dict[MetadataIndex, Any] = {}
        for rank in results:
            for result in rank:
                storage[result.index] = result.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        blob = bytearray(pickle.dumps(metadata))
        self._session().put_object(
            self.client, Bucket=self.bucket, Key=join_key(self.prefix, METADATA_NAME), source=blob, strict=self.strict
        )

    # ---------------------------------------------------------------- the data object

    def _write(self, name: str, items: Sequence[WriteItem], planner: SavePlanner) -> List[WriteResult]:
        datas: List[Any] = []
        shapes: List[Optional[Tuple[int, ...]]] = []
        for item in items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                datas.append(bytes(data.getbuffer()) if isinstance(data, io.BytesIO) else bytes(data))
                shapes.append(None)
            else:
                tensor = data.detach()
                if tensor.device.type not in ("cpu", "cuda"):
                    tensor = tensor.cpu()
                # A tensor that is not contiguous is copied (once) here.
                datas.append(_flat_bytes(tensor.contiguous()))
                shapes.append(tuple(int(n) for n in tensor.shape))
        sizes = [len(d) if isinstance(d, bytes) else int(d.numel()) for d in datas]
        layout = lay_out(sizes, [not isinstance(d, bytes) for d in datas], buffer_part=self.buffer_part)
        self._upload(join_key(self.prefix, name), layout, datas)
        results = []
        for item, shape, offset, size in zip(items, shapes, layout.offsets, sizes):
            results.append(WriteResult(item.index, size, StoredItem(name, offset, size, shape)))
        return results

    def _source(self, part: Part, datas: List[Any]) -> Any:
        """What `part` is sent from: a slice of a tensor, or a host buffer
        its pieces are copied into."""
        if part.direct is not None:
            return datas[part.direct][part.start : part.start + part.length]
        buffer = torch.empty(part.length, dtype=torch.uint8)
        for piece in part.pieces:
            data = datas[piece.index]
            into = buffer[piece.at - part.offset : piece.at - part.offset + piece.length]
            if isinstance(data, bytes):
                into.copy_(torch.frombuffer(bytearray(data[piece.start : piece.start + piece.length]), dtype=torch.uint8))
            else:
                into.copy_(data[piece.start : piece.start + piece.length])
        return buffer

    def _upload(self, key: str, layout: Any, datas: List[Any]) -> None:
        session = self._session()
        if not layout.parts:
            return  # nothing but empty tensors, or no items: no object to read
        if len(layout.parts) == 1:
            source = self._source(layout.parts[0], datas)
            session.put_object(self.client, Bucket=self.bucket, Key=key, source=source, strict=self.strict)
            return
        # The whole object's CRC-64/NVME is declared only where every part
        # is host memory (the session checksums no GPU memory).
        on_gpu = any(p.direct is not None and datas[p.direct].is_cuda for p in layout.parts)
        verify = session.verify and not on_gpu
        declared = {"ChecksumAlgorithm": "CRC64NVME", "ChecksumType": "FULL_OBJECT"} if verify else {}
        where = _session._where(f"CreateMultipartUpload {self.bucket}/{key}", self.client)
        upload_id = session._s3(where, lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key, **declared))[
            "UploadId"
        ]

        def one(part: Part) -> Tuple[Optional[str], Optional[int]]:
            source = self._source(part, datas)
            view = _buffers.view_of(source, writable=False)
            _, etag, crc = session._put(
                self.client, self.bucket, key, source, view, 0, part.length, self.strict,
                (upload_id, part.number), {}, None, verify,
            )
            return etag, crc

        try:
            with concurrent.futures.ThreadPoolExecutor(
                max_workers=min(self.thread_count, len(layout.parts)), thread_name_prefix="hipobj-dcp"
            ) as pool:
                done = list(pool.map(one, layout.parts))
            parts = []
            whole = 0
            for part, (etag, crc) in zip(layout.parts, done):
                entry: Dict[str, Any] = {"PartNumber": part.number, "ETag": etag}
                if verify and crc is not None:
                    entry["ChecksumCRC64NVME"] = _checksums.encode(crc)
                    whole = _checksums.combine(whole, crc, part.length)
                parts.append(entry)
            complete = {"ChecksumCRC64NVME": _checksums.encode(whole), "ChecksumType": "FULL_OBJECT"} if verify else {}
            session._s3(
                _session._where(f"CompleteMultipartUpload {self.bucket}/{key}", self.client),
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **complete
                ),
            )
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise


class HipObjStorageReader(_Checkpoint, StorageReader):
    """DCP's ``StorageReader`` of a checkpoint that ``HipObjStorageWriter``
    wrote under the S3 prefix `path`. Each tensor's bytes land in the
    tensor the load planner gives (GPU or host memory) by ranged GETs,
    `max_in_flight` of them at once (the session's own bound applies too);
    items of bytes are read, coalesced, into host memory and handed to
    ``planner.load_bytes``. `client`, `session`, `endpoint`, `region` and
    `strict` as for the writer."""

    def __init__(
        self,
        path: Union[str, None] = None,
        *,
        client: Any = None,
        session: Optional[_session.Session] = None,
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        strict: bool = False,
    ) -> None:
        super().__init__()
        self._open(path, client, session, endpoint, region, strict)
        self.load_id = uuid.uuid4().hex
        self.storage_data: Dict[MetadataIndex, StoredItem] = {}
        self.metadata: Optional[Metadata] = None

    def reset(self, checkpoint_id: Union[str, Any, None] = None) -> None:
        self._reset_place(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """``.metadata``, over plain HTTP (it is small and pickled)."""
        key = join_key(self.prefix, METADATA_NAME)
        where = _session._where(f"GET {self.bucket}/{key} (the checkpoint's metadata)", self.client)
        response = self._session()._s3(where, lambda: self.client.get_object(Bucket=self.bucket, Key=key))
        metadata = pickle.loads(response["Body"].read())
        if not isinstance(metadata, Metadata):
            raise ValueError(f"{where}: not a DCP checkpoint's metadata ({type(metadata).__name__})")
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.metadata = metadata
        self.storage_data = dict(metadata.storage_data or {})
        for index, stored in self.storage_data.items():
            if not isinstance(stored, StoredItem):
                raise ValueError(
                    f"{self.uri}: item {index.fqn} was not written by HipObjStorageWriter "
                    f"({type(stored).__name__}); read it with the reader of the writer that saved it"
                )

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def _stored(self, item: ReadItem) -> StoredItem:
        try:
            return self.storage_data[item.storage_index]
        except KeyError:
            raise ValueError(f"{self.uri}: the checkpoint's metadata has no item {item.storage_index}") from None

    def _dtype(self, item: ReadItem) -> torch.dtype:
        assert self.metadata is not None
        return self.metadata.state_dict_metadata[item.storage_index.fqn].properties.dtype

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        session = self._session()
        futures: List[concurrent.futures.Future] = []
        # (item, destination, what was read into, whole rows read) for commit.
        landed: List[Tuple[ReadItem, torch.Tensor, torch.Tensor, Optional[Tuple[int, ...]]]] = []
        byte_requests: List[Request] = []
        for item in plan.items:
            stored = self._stored(item)
            key = join_key(self.prefix, stored.name)
            if item.type == LoadItemType.BYTE_IO:
                byte_requests.append(Request(key, stored.offset, stored.length, item))
                continue
            dest = planner.resolve_tensor(item).detach()
            dtype = self._dtype(item)
            itemsize = torch.empty(0, dtype=dtype).element_size()
            shape = stored.shape if stored.shape is not None else ()
            offsets, lengths = tuple(item.storage_offsets), tuple(item.lengths)
            ranges = box_ranges(shape, itemsize, offsets, lengths, MAX_RANGES)
            rows: Optional[Tuple[int, ...]] = None
            if ranges is None:
                # Too many small ranges: whole rows of the outer dimension,
                # one range, into a scratch tensor narrowed afterwards.
                row = itemsize
                for n in shape[1:]:
                    row *= n
                ranges = [(offsets[0] * row, lengths[0] * row)]
                rows = (lengths[0], *shape[1:])
                target = torch.empty(rows, dtype=dtype, device=dest.device)
            elif dest.is_contiguous() and dest.dtype == dtype:
                target = dest
            else:
                target = torch.empty(lengths, dtype=dtype, device=dest.device)
            landed.append((item, dest, target, rows))
            flat = _flat_bytes(target)
            at = 0
            for offset, length in ranges:
                first = stored.offset + offset
                futures.append(
                    session.get_object_async(
                        self.client, Bucket=self.bucket, Key=key, into=flat, offset=at,
                        Range=f"bytes={first}-{first + length - 1}", strict=self.strict,
                    )
                )
                at += length
        bytes_futures = []
        for read in plan_reads(byte_requests):
            buffer = bytearray(read.length)
            bytes_futures.append((read, buffer))
            futures.append(
                session.get_object_async(self.client, Bucket=self.bucket, Key=read.name, into=buffer, Range=read.range, strict=self.strict)
            )
        _session._gather(futures, False)
        for read, buffer in bytes_futures:
            for request in read.requests:
                start = request.offset - read.offset
                planner.load_bytes(request.tag, io.BytesIO(bytes(buffer[start : start + request.length])))
        for request in byte_requests:
            if request.length == 0:
                planner.load_bytes(request.tag, io.BytesIO(b""))
        for item, dest, target, rows in landed:
            if rows is not None:
                for d in range(1, len(rows)):
                    target = target.narrow(d, item.storage_offsets[d], item.lengths[d])
            if target is not dest:
                dest.copy_(target)
            planner.commit_tensor(item, dest)
        future: Future = Future()
        future.set_result(None)
        return future
