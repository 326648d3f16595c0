"""The checksums of S3's own headers over the bytes a transfer moves
(``docs/protocol.md``, *Checksums*): base64 of the big-endian CRC.

The CRCs are the AWS Common Runtime's (``awscrt.checksums``: SIMD
CRC-64/NVME, CRC-32C and CRC-32, the ones botocore itself uses for
CRC64NVME), over the caller's memory without a copy."""

from __future__ import annotations

import base64
import binascii
import ctypes
from typing import Any, Dict, Optional, Tuple

from awscrt import checksums as _crt

#: The CRC-64/NVME of the bytes a PUT or part stores (with a token, of the
#: bytes the server READs), or of a whole object.
CRC64NVME = "x-amz-checksum-crc64nvme"
#: The server's CRC-64/NVME of the bytes it WROTE by RDMA, in its reply to
#: a GET that asked with ``x-amz-checksum-mode: ENABLED``.
RDMA_CRC64NVME = "x-amz-rdma-checksum-crc64nvme"

#: Header, width in bytes and function of each checksum a whole object's
#: answer may carry, CRC-64/NVME first.
_WHOLE = (
    (CRC64NVME, 8, _crt.crc64nvme),
    ("x-amz-checksum-crc32c", 4, _crt.crc32c),
    ("x-amz-checksum-crc32", 4, _crt.crc32),
)

#: CRC-64/NVME's polynomial, reflected (the catalogue's 0xad93d23594c93659).
_POLY64 = 0x9A6C9329AC4BC9B5
_MASK64 = (1 << 64) - 1


def host_memory(ptr: int, length: int) -> Any:
    """`length` bytes of host memory at `ptr`, as a buffer (no copy)."""
    return (ctypes.c_char * length).from_address(ptr) if length else b""


def crc64nvme(data: Any) -> int:
    """The CRC-64/NVME of `data` (anything with the buffer protocol)."""
    return _crt.crc64nvme(data)


def encode(crc: int, width: int = 8) -> str:
    """A header's value: base64 of the CRC's `width` big-endian bytes."""
    return base64.b64encode(crc.to_bytes(width, "big")).decode("ascii")


def decode(value: Optional[str], width: int = 8) -> Optional[int]:
    """The CRC a header's value carries; ``None`` for a value that is not
    base64 of `width` bytes (a composite checksum's ``...-N`` included)."""
    if value is None:
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return int.from_bytes(raw, "big") if len(raw) == width else None


def _gf2_times(matrix: Tuple[int, ...], vector: int) -> int:
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_square(matrix: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(_gf2_times(matrix, row) for row in matrix)


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-64/NVME of A followed by B, from A's (`crc1`), B's (`crc2`)
    and B's length: a multipart upload's whole-object checksum from its
    parts' (zlib's ``crc32_combine``, over GF(2) with CRC-64/NVME's
    polynomial: `len2` zero bytes applied to `crc1` by squaring the
    one-zero-bit operator)."""
    if len2 <= 0:
        return crc1
    # The operator of one zero bit, squared into that of two, then four.
    op = (_POLY64,) + tuple(1 << (n - 1) for n in range(1, 64))
    op = _gf2_square(_gf2_square(op))
    while len2:
        # Of 8 zero bits (one byte) at the first pass, then doubling.
        op = _gf2_square(op)
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
    return (crc1 ^ crc2) & _MASK64


def _covers_all(content_range: str) -> bool:
    spec = content_range.strip()
    if not spec.startswith("bytes "):
        return False
    span, _, size = spec[len("bytes ") :].partition("/")
    first, _, last = span.partition("-")
    if not (first.isdigit() and last.isdigit() and size.isdigit()):
        return False
    return int(first) == 0 and int(last) + 1 == int(size)


def whole_object(status: int, headers: Dict[str, str]) -> Optional[Tuple[str, int, Any]]:
    """The checksum of the whole object that a plain answer carries, if its
    body is the whole object (a 200 without ``Content-Range``, or a 206
    whose range is every byte) and the checksum is not a composite one:
    ``(header, value, function)``."""
    lower = {k.lower(): v for k, v in headers.items()}
    kind = lower.get("x-amz-checksum-type")
    if kind is not None and kind.strip().upper() != "FULL_OBJECT":
        return None
    content_range = lower.get("content-range")
    whole = status == 200 if content_range is None else _covers_all(content_range)
    if not whole:
        return None
    for name, width, function in _WHOLE:
        value = decode(lower.get(name), width)
        if value is not None:
            return name, value, function
    return None
