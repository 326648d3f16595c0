"""hipobj: S3 objects moved by RDMA between an S3 server and host or GPU
memory, through libhipobj and your own boto3 client.

    import boto3, numpy, hipobj

    s3 = boto3.client("s3", endpoint_url="http://s3.example:9000")
    with hipobj.Session(nic="mlx5_0") as session:
        array = numpy.empty(64 << 20, dtype=numpy.uint8)
        t = session.get_object(s3, Bucket="b", Key="k", into=array)
        print(t.path, t.bytes)          # "rdma", or "fallback" and why

The token travels in the ``x-amz-rdma-token`` header, added through
botocore's own ``before-sign`` event so that SigV4 signs it; the server's
``x-amz-rdma-reply`` comes back in the answer. A server that declines RDMA
(501) makes the transfer fall back to a plain GET or PUT, unless
``strict=True``. Buffers: anything with the buffer protocol (bytearray,
NumPy), ``__cuda_array_interface__`` (CuPy, PyTorch CUDA and ROCm tensors)
or DLPack, contiguous. ``Session.register`` keeps a buffer registered
until ``release`` or ``close``; one passed to a transfer stays registered
among the 16 used last, while it lives; ``bytes`` go through one
registered bounce buffer per session.

Bytes are checked by default (``Session(verify=True)``, or ``verify=`` on
a call): a PUT from host memory carries the CRC-64/NVME of its bytes, a
GET into host memory compares its bytes with the server's CRC of what it
wrote. GPU memory is not checked (it cannot be read without a copy);
``Transfer.verified`` says what was.

Many at once: ``get_object_async`` and ``put_object_async`` return
``concurrent.futures`` futures, ``aget_object`` and ``aput_object`` are
asyncio coroutines, ``get_objects`` and ``put_objects`` run a batch and
return its results in order; at most ``Session(max_in_flight=16)`` run at
once, each on a transfer thread that waits in the library with the GIL
released. ``hipobj.as_completed`` is ``concurrent.futures.as_completed``.

    futures = [session.get_object_async(s3, Bucket="b", Key=k, into=buf)
               for k, buf in zip(keys, buffers)]
    for done in hipobj.as_completed(futures):
        print(done.result().path)
"""

import ctypes as _ctypes
from concurrent.futures import as_completed
from typing import Optional as _Optional
from typing import Tuple as _Tuple

from ._buffers import UnusableBufferError, View
from ._gpu import set_copier
from ._lib import library
from ._session import HipObjError, ObjectChangedError, Session, Stats, Transfer, TransferError, active

#: The earlier name of ``UnusableBufferError`` (not in ``__all__``: a star
#: import would hide Python's own ``BufferError``).
BufferError = UnusableBufferError

#: This package's version (the packaging metadata reads it from here).
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "active",
    "as_completed",
    "get_object",
    "put_object",
    "upload",
    "HipObjError",
    "ObjectChangedError",
    "Session",
    "Stats",
    "Transfer",
    "TransferError",
    "UnusableBufferError",
    "View",
    "library",
    "library_version",
    "set_copier",
    "version",
]


def version() -> str:
    """libhipobj's version string (``"M.m.p"``); ``ImportError`` when no
    library loads. The package's own is ``__version__``."""
    return library().hipObjGetVersionString().decode()


def library_version() -> _Optional[_Tuple[int, int, int]]:
    """libhipobj's ``(major, minor, patch)`` (``hipObjGetVersion``), or
    ``None`` when no library loads."""
    try:
        lib = library()
    except ImportError:
        return None
    major, minor, patch = _ctypes.c_int(), _ctypes.c_int(), _ctypes.c_int()
    lib.hipObjGetVersion(_ctypes.byref(major), _ctypes.byref(minor), _ctypes.byref(patch))
    return major.value, minor.value, patch.value


def get_object(client, Bucket, Key, into, Range=None, strict=False, **kwargs) -> Transfer:
    """``active().get_object(...)``: see ``Session.get_object``."""
    return active().get_object(client, Bucket=Bucket, Key=Key, into=into, Range=Range, strict=strict, **kwargs)


def put_object(client, Bucket, Key, source, strict=False, **kwargs) -> Transfer:
    """``active().put_object(...)``: see ``Session.put_object``."""
    return active().put_object(client, Bucket=Bucket, Key=Key, source=source, strict=strict, **kwargs)


def upload(client, Bucket, Key, source, part_size=64 << 20, strict=False, verify=None) -> Transfer:
    """``active().upload(...)``: see ``Session.upload``."""
    return active().upload(
        client, Bucket=Bucket, Key=Key, source=source, part_size=part_size, strict=strict, verify=verify
    )
