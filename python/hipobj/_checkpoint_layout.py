"""Where a checkpoint's bytes lie in S3, without PyTorch: ``s3://`` URIs,
the names of a distributed checkpoint's objects, the layout of one rank's
data object (which items are sent straight from their tensors, which are
packed into parts), and the byte ranges a load reads (the rows of a
sub-box of a stored tensor, coalesced reads of small items).

``hipobj.dcp`` and ``hipobj.s3torchconnector`` build on it; it is kept free
of PyTorch so that its rules are tested where PyTorch is not installed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

#: The object holding a checkpoint's pickled ``Metadata`` (DCP's own name).
METADATA_NAME = ".metadata"
#: A part of a multipart upload but the last is at least this (S3's rule).
MIN_PART = 5 << 20
#: The largest part S3 takes.
MAX_PART = 5 << 30


class S3UriError(ValueError):
    """A string that is not ``s3://BUCKET[/KEY]``."""


def parse_s3_uri(uri: str) -> Tuple[str, str]:
    """``s3://bucket/some/key`` as ``("bucket", "some/key")`` (the key may
    be empty: ``s3://bucket`` and ``s3://bucket/``). ``S3UriError`` names
    what is wrong with anything else."""
    if not isinstance(uri, str):
        raise S3UriError(f"an S3 URI is a string (s3://BUCKET/KEY), not {type(uri).__name__}")
    if not uri.startswith("s3://"):
        raise S3UriError(f"{uri!r} is not an S3 URI: it should start with s3:// (s3://BUCKET/KEY)")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise S3UriError(f"{uri!r} names no bucket (s3://BUCKET/KEY)")
    if any(c in bucket for c in " \\?#"):
        raise S3UriError(f"{uri!r}: {bucket!r} is not a bucket name")
    return bucket, key


def join_key(prefix: str, name: str) -> str:
    """`name` under the checkpoint prefix `prefix` (``"ckpt/step-1"`` and
    ``".metadata"`` give ``"ckpt/step-1/.metadata"``; an empty prefix is the
    bucket's top)."""
    prefix = prefix.rstrip("/")
    return f"{prefix}/{name}" if prefix else name


def data_object_name(rank_prefix: str, file: int = 0) -> str:
    """The data object of the rank whose global plan gave it `rank_prefix`
    (``"__0_"``), as DCP's ``FileSystemWriter`` names its files:
    ``__0_0.distcp``."""
    return f"{rank_prefix}{file}.distcp"


def rank_prefix(rank: int) -> str:
    """What ``prepare_global_plan`` gives the plan of `rank`."""
    if rank < 0:
        raise ValueError(f"a rank is 0 or more, not {rank}")
    return f"__{rank}_"


@dataclass(frozen=True)
class StoredItem:
    """Where one saved item lies: `length` bytes at `offset` of the data
    object `name` (relative to the checkpoint's prefix). A tensor's bytes
    are its elements in row-major order, as in memory (no header, no
    pickling), `shape` its shape; ``None`` for an item of bytes."""

    name: str
    offset: int
    length: int
    shape: Optional[Tuple[int, ...]] = None


# ---------------------------------------------------------------- saving


@dataclass(frozen=True)
class Piece:
    """`length` bytes of item `index`, from its byte `start`, at byte `at`
    of the data object."""

    index: int
    start: int
    length: int
    at: int


@dataclass(frozen=True)
class Part:
    """One part of a data object's upload (number from 1): `length` bytes
    at `offset`. A part with `direct` set is sent straight from that item's
    memory (bytes `start` to `start + length` of it); one without, from a
    host buffer its `pieces` are copied into."""

    number: int
    offset: int
    length: int
    direct: Optional[int] = None
    start: int = 0
    pieces: Tuple[Piece, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Layout:
    """A data object's layout: each item's offset in it (in the items'
    order), its parts, and its size."""

    offsets: Tuple[int, ...]
    parts: Tuple[Part, ...]
    size: int


def lay_out(
    sizes: Sequence[int],
    straight: Sequence[bool],
    buffer_part: int = 64 << 20,
    max_part: int = 1 << 30,
    min_part: int = MIN_PART,
) -> Layout:
    """Lays one rank's items out in its data object, in upload parts.

    An item that may be sent straight from its memory (`straight`, a
    contiguous tensor) and holds at least `min_part` bytes comes first, in
    parts of its own: split into as few equal parts as keep each within
    `max_part` (so every one is at least `min_part`, S3's least for a part
    but the last). The other items follow, packed in their order into
    parts of `buffer_part` bytes (the last shorter), each copied into a
    host buffer when it is sent. So every part but the last is at least
    `min_part`, and no item is copied that need not be."""
    if len(sizes) != len(straight):
        raise ValueError("one `straight` flag per item")
    if not min_part <= buffer_part <= max_part:
        raise ValueError(f"parts: {min_part} <= buffer_part ({buffer_part}) <= max_part ({max_part})")
    if any(s < 0 for s in sizes):
        raise ValueError("item sizes are 0 or more")
    offsets = [0] * len(sizes)
    parts: List[Part] = []
    at = 0
    big = [i for i, (n, s) in enumerate(zip(sizes, straight)) if s and n >= min_part]
    for i in big:
        n = sizes[i]
        count = -(-n // max_part)
        base, extra = divmod(n, count)
        offsets[i] = at
        start = 0
        for k in range(count):
            length = base + (1 if k < extra else 0)
            parts.append(Part(len(parts) + 1, at + start, length, direct=i, start=start))
            start += length
        at += n
    chosen = set(big)
    pieces: List[Piece] = []
    filled = 0
    part_offset = at
    for i, n in enumerate(sizes):
        if i in chosen:
            continue
        offsets[i] = at
        start = 0
        while start < n:
            take = min(n - start, buffer_part - filled)
            pieces.append(Piece(i, start, take, at))
            start += take
            at += take
            filled += take
            if filled == buffer_part:
                parts.append(Part(len(parts) + 1, part_offset, filled, pieces=tuple(pieces)))
                pieces, filled, part_offset = [], 0, at
    if filled:
        parts.append(Part(len(parts) + 1, part_offset, filled, pieces=tuple(pieces)))
    return Layout(tuple(offsets), tuple(parts), at)


# ---------------------------------------------------------------- loading


def box_ranges(
    shape: Sequence[int],
    itemsize: int,
    offsets: Sequence[int],
    lengths: Sequence[int],
    limit: Optional[int] = None,
) -> Optional[List[Tuple[int, int]]]:
    """The byte ranges, ``(offset, length)`` in a row-major tensor of
    `shape` with items of `itemsize` bytes, that hold the sub-box starting
    at `offsets` of `lengths`: in row-major order of the box, so that,
    read one after another into a contiguous tensor of shape `lengths`,
    they fill it. Adjacent ranges are one. ``None`` when there would be more
    than `limit`; ``[]`` for an empty box. ``ValueError`` for a box that
    does not fit."""
    if not len(shape) == len(offsets) == len(lengths):
        raise ValueError(f"shape {tuple(shape)}, offsets {tuple(offsets)} and lengths {tuple(lengths)} differ in rank")
    for d, (n, o, k) in enumerate(zip(shape, offsets, lengths)):
        if o < 0 or k < 0 or o + k > n:
            raise ValueError(f"dimension {d}: {k} items from {o} do not fit {n}")
    if itemsize <= 0:
        raise ValueError(f"an item size is positive, not {itemsize}")
    if any(k == 0 for k in lengths):
        return []
    strides = [itemsize] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    # The innermost dimensions the box covers whole are one run of bytes,
    # and so is the box's slice of the next one out.
    d = len(shape) - 1
    while d >= 0 and offsets[d] == 0 and lengths[d] == shape[d]:
        d -= 1
    if d < 0:
        total = itemsize
        for n in shape:
            total *= n
        return [(0, total)]
    run = lengths[d] * strides[d]
    count = 1
    for k in lengths[:d]:
        count *= k
    if limit is not None and count > limit:
        return None
    ranges: List[Tuple[int, int]] = []
    index = [0] * d
    for _ in range(count):
        start = offsets[d] * strides[d] + sum((offsets[j] + index[j]) * strides[j] for j in range(d))
        if ranges and ranges[-1][0] + ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + run)
        else:
            ranges.append((start, run))
        for j in range(d - 1, -1, -1):
            index[j] += 1
            if index[j] < lengths[j]:
                break
            index[j] = 0
    return ranges


@dataclass(frozen=True)
class Request:
    """`length` bytes at `offset` of object `name`, for `tag`."""

    name: str
    offset: int
    length: int
    tag: Any = None


@dataclass(frozen=True)
class Read:
    """One ranged GET: `length` bytes at `offset` of object `name`, which
    holds each request of `requests` at its offset minus `offset`."""

    name: str
    offset: int
    length: int
    requests: Tuple[Request, ...]

    @property
    def range(self) -> str:
        """The GET's ``Range`` header."""
        return f"bytes={self.offset}-{self.offset + self.length - 1}"


def plan_reads(requests: Sequence[Request], gap: int = 0, max_bytes: int = 64 << 20) -> List[Read]:
    """Ranged GETs that serve `requests` (empty ones need none): those of
    one object whose bytes touch, overlap or lie at most `gap` bytes apart
    are read together while the read stays within `max_bytes` (a request
    longer than that is read alone). In order of object, then offset."""
    if gap < 0 or max_bytes <= 0:
        raise ValueError("gap is 0 or more, max_bytes positive")
    for r in requests:
        if r.offset < 0 or r.length < 0:
            raise ValueError(f"{r.name}: {r.length} bytes at {r.offset} is no range")
    wanted = sorted((r for r in requests if r.length > 0), key=lambda r: (r.name, r.offset, r.length))
    reads: List[Read] = []
    group: List[Request] = []
    start = end = 0
    for r in wanted:
        if group and r.name == group[0].name and r.offset <= end + gap and max(end, r.offset + r.length) - start <= max_bytes:
            group.append(r)
            end = max(end, r.offset + r.length)
            continue
        if group:
            reads.append(Read(group[0].name, start, end - start, tuple(group)))
        group, start, end = [r], r.offset, r.offset + r.length
    if group:
        reads.append(Read(group[0].name, start, end - start, tuple(group)))
    return reads
