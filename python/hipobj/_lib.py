"""The C ABI of libhipobj (``hipobj.h``), loaded with ctypes.

The library is the one ``HIPOBJ_LIBRARY`` names (a path; then nothing
else is tried), else the dynamic loader's own search finds
(``libhipobj.so.0``: an installed prefix on ``LD_LIBRARY_PATH`` or in the
loader's cache), else, when this package runs from a checkout of the
repository (not installed), the checkout's ``target/release``. Nothing else
is linked: libhipobj opens libibverbs and the GPU runtime itself, and says
on stderr what it could not find.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading
from typing import List, Optional

SONAME = "libhipobj.so.0"

OP_PUT = 0
OP_GET = 1
REPLY_NOT_IMPLEMENTED = 501
REPLY_BUFFER = 512
TOKEN_LEN = 88

#: hipObjOpError_t, by value.
CODES = {
    0: "hipObjSuccess",
    1: "hipObjInvalidValue",
    2: "hipObjNotInitialized",
    3: "hipObjAlreadyInitialized",
    4: "hipObjRdmaError",
    5: "hipObjS3Error",
    6: "hipObjBufNotRegistered",
    7: "hipObjBufAlreadyRegistered",
    8: "hipObjNicNotFound",
    9: "hipObjDmabufNotSupported",
    10: "hipObjSizeTooLarge",
    11: "hipObjInternalError",
    12: "hipObjNotSupported",
    13: "hipObjBusy",
}
SUCCESS = 0
RDMA_ERROR = 4
S3_ERROR = 5
BUF_ALREADY_REGISTERED = 7
NIC_NOT_FOUND = 8
#: ``hipErrorNoDevice``: the ``hipError`` of ``hipObjInit`` without a GPU.
HIP_ERROR_NO_DEVICE = 100


class ErrorT(ctypes.Structure):
    """``hipObjError_t``."""

    _fields_ = [("opError", ctypes.c_int), ("hipError", ctypes.c_int)]


class ConfigT(ctypes.Structure):
    """``hipObjConfig_t``."""

    _fields_ = [
        ("endpoint", ctypes.c_char_p),
        ("region", ctypes.c_char_p),
        ("accessKey", ctypes.c_char_p),
        ("secretKey", ctypes.c_char_p),
        ("flags", ctypes.c_uint32),
        ("gpuDevice", ctypes.c_int),
        ("nicHint", ctypes.c_char_p),
    ]


#: ``int (*sendRequest)(void *ctx, const char *token, size_t tokenLen)``
SEND_REQUEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
#: ``int (*recvReply)(void *ctx, char *reply, size_t *replyLen)``
RECV_REPLY = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
)


class OpsT(ctypes.Structure):
    """``hipObjOps_t``."""

    _fields_ = [("sendRequest", SEND_REQUEST), ("recvReply", RECV_REPLY)]


#: This package's directory.
PACKAGE = pathlib.Path(__file__).resolve().parent


def _checkout(package: pathlib.Path) -> Optional[pathlib.Path]:
    """The repository's root when `package` is its ``python/hipobj``."""
    python, root = package.parent, package.parent.parent
    if python.name == "python" and (python / "pyproject.toml").is_file() and (root / "Cargo.toml").is_file():
        return root
    return None


def _candidates(package: pathlib.Path = PACKAGE) -> List[str]:
    """What ``library()`` tries, in order."""
    explicit = os.environ.get("HIPOBJ_LIBRARY")
    if explicit:
        return [explicit]
    names = [SONAME]
    root = _checkout(package)
    if root is not None:
        names.append(str(root / "target" / "release" / "libhipobj.so"))
    return names


def _tried(name: str, error: OSError) -> str:
    """One failed candidate, said with where it came from (the loader's
    message names the file)."""
    if os.environ.get("HIPOBJ_LIBRARY"):
        return f"HIPOBJ_LIBRARY: {error}"
    if name == SONAME:
        return f"the dynamic loader's search (LD_LIBRARY_PATH, then its cache): {error}"
    return f"this checkout's build: {error}"


def _not_found(errors: List[str]) -> str:
    if os.environ.get("HIPOBJ_LIBRARY"):
        fix = "point HIPOBJ_LIBRARY at the library's path, or unset it to use the dynamic loader's search"
    else:
        fix = (
            "install it where the loader finds it (scripts/install.sh --prefix /usr/local, then ldconfig), "
            "or set HIPOBJ_LIBRARY to its path"
        )
    return f"libhipobj not found ({'; '.join(errors)}): {fix}"


def _prototypes(lib: ctypes.CDLL) -> None:
    off_t = ctypes.c_long
    table = {
        "hipObjInit": ([ctypes.POINTER(ConfigT)], ErrorT),
        "hipObjShutdown": ([], ErrorT),
        "hipObjBufRegister": ([ctypes.c_void_p, ctypes.c_size_t], ErrorT),
        "hipObjBufRegisterHost": ([ctypes.c_void_p, ctypes.c_size_t], ErrorT),
        "hipObjBufDeregister": ([ctypes.c_void_p], ErrorT),
        "hipObjGet": (
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, off_t, ctypes.POINTER(OpsT), ctypes.c_void_p],
            ErrorT,
        ),
        "hipObjPut": (
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, off_t, ctypes.POINTER(OpsT), ctypes.c_void_p],
            ErrorT,
        ),
        "hipObjParseRdmaReply": ([ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)], ErrorT),
        "hipObjGetErrorString": ([ctypes.c_int], ctypes.c_char_p),
        "hipObjGetVersionString": ([], ctypes.c_char_p),
        "hipObjGetVersion": ([ctypes.POINTER(ctypes.c_int)] * 3, ErrorT),
    }
    for name, (args, result) in table.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = result


_loaded: Optional[ctypes.CDLL] = None
_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """libhipobj, loaded once; ``ImportError`` naming what was tried, and
    how to point at the library, when none loads (tried again at the next
    call)."""
    global _loaded
    with _lock:
        if _loaded is None:
            errors = []
            for name in _candidates():
                try:
                    lib = ctypes.CDLL(name)
                except OSError as e:
                    errors.append(_tried(name, e))
                    continue
                _prototypes(lib)
                _loaded = lib
                break
            else:
                raise ImportError(_not_found(errors))
        return _loaded


def after_fork_in_child() -> None:
    """A fresh lock in a forked child (another thread may have held it)."""
    global _lock
    _lock = threading.Lock()


def error_name(code: int) -> str:
    """The name of a ``hipObjOpError_t`` value."""
    return CODES.get(code, f"hipObjOpError_t {code}")


def parse_reply(reply: str) -> Optional[int]:
    """The HTTP status an ``x-amz-rdma-reply`` stands for, by the library's
    own parser (``hipObjParseRdmaReply``); ``None`` for a reply it refuses."""
    raw = reply.encode("ascii", "replace")
    code = ctypes.c_int(0)
    err = library().hipObjParseRdmaReply(raw, len(raw), ctypes.byref(code))
    return code.value if err.opError == SUCCESS else None
