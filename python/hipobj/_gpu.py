"""Copies between host memory and GPU memory, for the plain-HTTP fallback
into or out of a GPU buffer: through the HIP runtime (``hipMemcpy``) when it
loads and sees a GPU, else the CUDA driver (``cuMemcpyHtoD``/``DtoH`` in the
context that owns the pointer), as libhipobj itself chooses its runtime.
``set_copier`` replaces them (a test's fake GPU, an application's own
stream)."""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Optional, Tuple

#: ``copy(dst, src, nbytes)`` between addresses.
Copy = Callable[[int, int, int], None]

_override: Optional[Tuple[Copy, Copy]] = None
_loaded: Optional[Tuple[Copy, Copy]] = None
_lock = threading.Lock()


def set_copier(to_device: Optional[Copy], to_host: Optional[Copy] = None) -> None:
    """Makes `to_device(dst, src, n)` and `to_host(dst, src, n)` the copies
    the fallback uses (``None``: the GPU runtime's again)."""
    global _override
    _override = None if to_device is None else (to_device, to_host or to_device)


def _hip() -> Optional[Tuple[Copy, Copy]]:
    for name in ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"):
        try:
            hip = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if hip.hipGetDeviceCount(ctypes.byref(count)) != 0 or count.value < 1:
            return None
        memcpy = hip.hipMemcpy
        memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

        def copy(dst: int, src: int, n: int) -> None:
            err = memcpy(dst, src, n, 4)  # hipMemcpyDefault
            if err != 0:
                raise OSError(f"hipMemcpy of {n} bytes failed with hipError_t {err}")

        return copy, copy
    return None


def _cuda() -> Optional[Tuple[Copy, Copy]]:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cu.cuInit(0) != 0:
        return None
    get_attr = cu.cuPointerGetAttribute
    get_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    push, pop = cu.cuCtxPushCurrent_v2, cu.cuCtxPopCurrent_v2
    push.argtypes = [ctypes.c_void_p]
    pop.argtypes = [ctypes.c_void_p]
    htod, dtoh = cu.cuMemcpyHtoD_v2, cu.cuMemcpyDtoH_v2
    htod.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    dtoh.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]

    def in_context(device_ptr: int, call) -> None:
        ctx = ctypes.c_void_p()
        # CU_POINTER_ATTRIBUTE_CONTEXT (1): the context that owns the memory.
        err = get_attr(ctypes.byref(ctx), 1, device_ptr)
        if err != 0:
            raise OSError(f"cuPointerGetAttribute failed with CUresult {err}")
        if push(ctx) != 0:
            raise OSError("cuCtxPushCurrent failed")
        try:
            err = call()
        finally:
            pop(ctypes.byref(ctypes.c_void_p()))
        if err != 0:
            raise OSError(f"a CUDA copy failed with CUresult {err}")

    def to_device(dst: int, src: int, n: int) -> None:
        in_context(dst, lambda: htod(dst, src, n))

    def to_host(dst: int, src: int, n: int) -> None:
        in_context(src, lambda: dtoh(dst, src, n))

    return to_device, to_host


def after_fork_in_child() -> None:
    """A fresh lock in a forked child (another thread may have held it)."""
    global _lock
    _lock = threading.Lock()


def copier() -> Tuple[Copy, Copy]:
    """``(to_device, to_host)``; ``OSError`` when no GPU runtime is there."""
    global _loaded
    if _override is not None:
        return _override
    with _lock:
        if _loaded is None:
            _loaded = _hip() or _cuda()
        if _loaded is None:
            raise OSError("no GPU runtime (HIP or the CUDA driver) to copy GPU memory with")
        return _loaded
