"""Where a Python object's bytes are: host memory through the buffer
protocol (bytearray, NumPy arrays, memoryviews), GPU memory through
``__cuda_array_interface__`` (CuPy, PyTorch CUDA and ROCm tensors, Numba)
or DLPack (``__dlpack__``). Only contiguous data is taken: a transfer moves
one range of bytes."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional


class UnusableBufferError(TypeError):
    """An object whose memory a transfer cannot use: not a buffer, not
    contiguous, or read-only where a GET writes. Raised before any request.
    (``hipobj.BufferError`` is its earlier name.)"""


# Shown as the package's own class in tracebacks, where it is exported.
UnusableBufferError.__module__ = "hipobj"


@dataclass(frozen=True)
class View:
    """One object's bytes."""

    #: The first byte's address.
    ptr: int
    #: Their number.
    nbytes: int
    #: GPU memory (else host memory).
    device: bool
    #: Whether they may be written (a GET needs it).
    writable: bool
    #: What keeps them alive (the object, or a ctypes array over it).
    owner: Any
    #: Read-only host memory, which ctypes cannot address (``ptr`` is 0):
    #: its bytes. A PUT sends them from the session's bounce buffer.
    data: Optional[memoryview] = None


def _itemsize(typestr: str) -> int:
    # e.g. "<f4", "|u1": the size is the number after the kind.
    try:
        return int(typestr[2:])
    except ValueError as e:
        raise UnusableBufferError(
            f"the array interface's typestr {typestr!r} gives no item size (expected e.g. '<f4')"
        ) from e


def _contiguous_bytes(shape, strides, itemsize: int) -> int:
    n = itemsize
    for dim in shape:
        n *= int(dim)
    if strides is not None:
        expected = itemsize
        for dim, stride in zip(reversed(shape), reversed(strides)):
            if int(dim) > 1 and int(stride) != expected:
                raise UnusableBufferError("the array is not C-contiguous: transfers move one range of bytes")
            expected *= int(dim)
    return n


def _cuda_array(obj: Any) -> View:
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    nbytes = _contiguous_bytes(cai["shape"], cai.get("strides"), _itemsize(cai["typestr"]))
    return View(int(ptr or 0), nbytes, True, not readonly, obj)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLDeviceType: CPU 1, CUDA 2, CUDAHost 3 (pinned host), ROCM 10,
# ROCMHost 11, CUDAManaged 13 (dlpack.h).
_DL_HOST = {1, 3, 11}
_DL_GPU = {2, 10, 13}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack(obj: Any) -> View:
    capsule = obj.__dlpack__()
    # DLManagedTensor begins with its DLTensor; the capsule is named
    # "dltensor" until a consumer takes it, which this never does (the
    # capsule's destructor releases it; `obj` keeps the memory alive).
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    kind = tensor.device.device_type
    if kind not in _DL_HOST | _DL_GPU:
        raise UnusableBufferError(f"DLPack device type {kind} is neither host nor GPU memory")
    itemsize = (tensor.dtype.bits * tensor.dtype.lanes + 7) // 8
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    strides = None
    if tensor.strides:
        strides = [tensor.strides[i] * itemsize for i in range(tensor.ndim)]
    nbytes = _contiguous_bytes(shape, strides, itemsize)
    ptr = (tensor.data or 0) + tensor.byte_offset
    # DLPack before 1.0 says nothing of read-only memory: taken as writable.
    return View(ptr, nbytes, kind in _DL_GPU, True, (obj, capsule))


def _host(obj: Any, writable: bool) -> View:
    try:
        mv = memoryview(obj)
    except TypeError as e:
        raise UnusableBufferError(
            f"{type(obj).__name__} is not a buffer, a CUDA array or a DLPack tensor"
        ) from e
    if not mv.c_contiguous:
        raise UnusableBufferError("the buffer is not C-contiguous: transfers move one range of bytes")
    nbytes = mv.nbytes
    if mv.readonly:
        if writable:
            raise UnusableBufferError("the buffer is read-only: a GET writes into it")
        # ctypes reaches writable buffers only, and the library registers
        # writable memory: a read-only source is copied when it is sent.
        return View(0, nbytes, False, False, (obj, mv), mv.cast("B"))
    array = (ctypes.c_char * nbytes).from_buffer(mv.cast("B")) if nbytes else None
    return View(ctypes.addressof(array) if array is not None else 0, nbytes, False, True, (obj, mv, array))


def view_of(obj: Any, writable: bool) -> View:
    """The bytes of `obj` (see the module's doc); ``UnusableBufferError`` (a
    ``TypeError``) for an object a transfer cannot use."""
    if isinstance(obj, View):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        view = _cuda_array(obj)
    elif hasattr(obj, "__dlpack__") and not hasattr(obj, "__array_interface__"):
        view = _dlpack(obj)
    else:
        view = _host(obj, writable)
    if writable and not view.writable:
        raise UnusableBufferError("the array is read-only: a GET writes into it")
    return view


def host_bytes(view: View, offset: int, length: int, copy_from_device) -> bytes:
    """`length` bytes of `view` at `offset`, on the host."""
    if view.device:
        out = (ctypes.c_char * length)()
        copy_from_device(ctypes.addressof(out), view.ptr + offset, length)
        return bytes(out)
    if view.data is not None:
        return bytes(view.data[offset : offset + length])
    return ctypes.string_at(view.ptr + offset, length)


def land(view: View, offset: int, data: bytes, copy_to_device) -> None:
    """Writes `data` into `view` at `offset`."""
    if not data:
        return
    if view.device:
        src = ctypes.create_string_buffer(data, len(data))
        copy_to_device(view.ptr + offset, ctypes.addressof(src), len(data))
    else:
        ctypes.memmove(view.ptr + offset, data, len(data))


def nbytes_of(obj: Any, writable: bool = False) -> Optional[int]:
    """How many bytes `obj` holds, for sizing."""
    return view_of(obj, writable).nbytes
