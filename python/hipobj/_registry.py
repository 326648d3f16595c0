"""What a session has registered with the library, and for how long.

The library registers memory by its first byte's address (one registration
per address, 256 at most), and the memory must stay allocated until it is
deregistered. Three kinds are kept here:

- explicit: ``Session.register(obj)``; `obj` is held (so its memory stays)
  until ``release(obj)`` or ``close()``;
- cached: memory passed to a transfer, kept registered after it among the
  `size` used last (least recently used first out) while its object lives:
  only a weak reference is held, and the object's death deregisters it.
  An object that takes no weak reference (``bytearray``) is registered for
  its transfer only;
- the bounce buffer (``Bounce``): one per session, for read-only sources.

A registration in use by a transfer is never deregistered under it: an
eviction, a release or a death waits for the transfer's end.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _buffers, _lib

#: Buffers passed to transfers that stay registered, by default.
CACHE = 16
#: The most bytes the bounce buffer of read-only sources grows to, by
#: default.
BOUNCE_LIMIT = 256 << 20
#: The bounce buffer's least size.
BOUNCE_MIN = 1 << 20

#: ``hipObjBusy``: the library still holds the buffer (a transfer, a copy).
_BUSY = 13

EXPLICIT, CACHED, TRANSIENT, BOUNCE = "explicit", "cached", "transient", "bounce"


class RegistrationError(Exception):
    """A registration the library refused; `error` is its ``HipObjError``."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class Entry:
    """One registration."""

    __slots__ = ("ptr", "nbytes", "device", "kind", "ref", "held", "exact", "busy", "dead", "doomed")

    def __init__(self, ptr: int, nbytes: int, device: bool, kind: str):
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self.kind = kind
        #: The weak reference to a cached entry's object.
        self.ref: Optional[weakref.ref] = None
        #: What keeps an explicit entry's memory allocated.
        self.held: Any = None
        #: An explicit entry's object whose memory is exactly the
        #: registered range (a cached one's is `ref`'s), if known.
        self.exact: Any = None
        #: Transfers using it now.
        self.busy = 0
        #: Its object is gone (the memory may be freed as soon as this is
        #: set): never found again, deregistered once not busy.
        self.dead = False
        #: Released or evicted while busy: deregistered once not busy.
        self.doomed = False

    def covers(self, view: _buffers.View) -> bool:
        return (
            self.device == view.device
            and self.ptr <= view.ptr
            and view.ptr + view.nbytes <= self.ptr + self.nbytes
        )

    def moved(self) -> bool:
        """Whether the object registered here now has other memory (a
        NumPy array or a tensor resized in place): the registration names
        memory that may be freed and, at the same address, another
        object's, reached through the old pages."""
        obj = self.ref() if self.ref is not None else self.exact
        if obj is None:
            return False
        try:
            now = _buffers.view_of(obj, writable=False)
        except Exception:  # noqa: BLE001 - whatever it became, not this memory
            return True
        return (now.ptr, now.nbytes, now.device) != (self.ptr, self.nbytes, self.device)


class Registry:
    """The registrations of one session in one process (a forked child
    starts another: ``abandon``)."""

    def __init__(self, lib: Any, size: int, error: Callable[..., Exception]):
        self.lib = lib
        self.size = size
        #: Makes the ``HipObjError`` of a failed call.
        self.error = error
        self.lock = threading.Lock()
        #: By first address: the library's key.
        self.entries: Dict[int, Entry] = {}
        #: Cached entries, least recently used first.
        self.lru: "collections.OrderedDict[int, Entry]" = collections.OrderedDict()
        #: After a fork, in the child: the parent's, never touched again.
        self.abandoned = False

    # ------------------------------------------------------------ the library

    def _register(self, entry: Entry) -> None:
        call = self.lib.hipObjBufRegister if entry.device else self.lib.hipObjBufRegisterHost
        err = call(entry.ptr, entry.nbytes)
        if err.opError != _lib.SUCCESS:
            name = "hipObjBufRegister" if entry.device else "hipObjBufRegisterHost"
            raise RegistrationError(self.error(name, err.opError, err.hipError, _describe(entry)))

    def _drop(self, entry: Entry) -> None:
        """Deregisters `entry` and forgets it; one the library still holds
        (``hipObjBusy``) is kept, dead, for the next look."""
        err = self.lib.hipObjBufDeregister(entry.ptr)
        if err.opError == _BUSY:
            entry.doomed = True
            return
        self.entries.pop(entry.ptr, None)
        self.lru.pop(entry.ptr, None)

    def _reap(self) -> None:
        """Deregisters the entries whose objects died or that were let go
        while in use, now that nothing uses them. Under the lock."""
        for entry in [e for e in self.entries.values() if (e.dead or e.doomed) and not e.busy]:
            self._drop(entry)

    def _forget_moved(self, view: _buffers.View) -> None:
        """Marks dead the registrations covering `view` whose objects now
        have other memory, and deregisters those not in use. Under the
        lock."""
        for entry in list(self.entries.values()):
            if entry.kind != BOUNCE and not entry.dead and entry.covers(view) and entry.moved():
                entry.dead = True
        self._reap()

    def _died(self, entry: Entry) -> None:
        """The weak reference's callback: `entry`'s object is being freed."""
        entry.dead = True
        if self.abandoned:
            return
        # Deregistered now if the lock is free; else (another thread, or
        # this one inside the registry) at the next call, and `dead` keeps
        # it from being found meanwhile.
        if self.lock.acquire(blocking=False):
            try:
                self._reap()
            finally:
                self.lock.release()

    # ------------------------------------------------------------ transfers

    def acquire(self, view: _buffers.View, obj: Any) -> Entry:
        """A registration covering `view` (the memory of `obj`), in use
        until ``unlease``: one there is, else a new one. Raises
        ``RegistrationError``."""
        with self.lock:
            self._forget_moved(view)
            for entry in self.entries.values():
                if entry.kind != BOUNCE and not entry.dead and not entry.doomed and entry.covers(view):
                    entry.busy += 1
                    if entry.kind == CACHED:
                        self.lru.move_to_end(entry.ptr)
                    return entry
            self._clear_address(view)
            entry = Entry(view.ptr, view.nbytes, view.device, TRANSIENT)
            if self.size > 0:
                try:
                    entry.ref = weakref.ref(obj, lambda _, e=entry: self._died(e))
                except TypeError:
                    pass  # bytearray and the like: for this transfer only
            if entry.ref is not None and self._make_room():
                entry.kind = CACHED
            else:
                entry.ref = None
            self._register(entry)
            entry.busy = 1
            self.entries[entry.ptr] = entry
            if entry.kind == CACHED:
                self.lru[entry.ptr] = entry
            return entry

    def unlease(self, entry: Entry) -> None:
        """`entry` is no longer used by the transfer that acquired it."""
        with self.lock:
            entry.busy -= 1
            if self.abandoned or entry.busy:
                return
            if entry.kind == TRANSIENT:
                entry.doomed = True
            self._reap()

    def _clear_address(self, view: _buffers.View) -> None:
        """Makes room at `view`'s address, where a cached registration of
        other bytes may be (the library keeps one per address). Under the
        lock."""
        there = self.entries.get(view.ptr)
        if there is None:
            return
        if there.kind == CACHED and not there.busy:
            self._drop(there)
            if view.ptr not in self.entries:
                return
        raise RegistrationError(
            self.error(
                "hipObjBufRegister" if view.device else "hipObjBufRegisterHost",
                _lib.BUF_ALREADY_REGISTERED,
                0,
                f"{_describe(there)} is registered already, for {there.nbytes} bytes "
                f"({'by Session.register' if there.kind == EXPLICIT else 'by a transfer in flight'}), "
                f"and this transfer's {view.nbytes} bytes are not inside it",
            )
        )

    def _make_room(self) -> bool:
        """Evicts cached entries until one more fits; whether it does (all
        of them may be in use). Under the lock."""
        while len(self.lru) >= self.size:
            victim = next((e for e in self.lru.values() if not e.busy), None)
            if victim is None:
                return False
            self._drop(victim)
            if victim.ptr in self.lru:
                # Still held by the library: not evicted after all.
                self.lru.pop(victim.ptr)
        return True

    # ------------------------------------------------------------ explicit

    def register(self, view: _buffers.View, obj: Any) -> Tuple[Entry, bool]:
        """Registers `view` (the memory of `obj`) until ``release``; the
        entry, and whether it was not already an explicit one."""
        with self.lock:
            self._forget_moved(view)
            there = self.entries.get(view.ptr)
            if there is not None and not there.dead and there.kind != BOUNCE and there.covers(view):
                created = there.kind != EXPLICIT
                if created:
                    self.lru.pop(there.ptr, None)
                    if there.ref is not None:
                        there.exact = there.ref()
                    elif there.nbytes == view.nbytes:
                        there.exact = obj
                    there.held = (there.exact, obj)
                    there.ref = None
                    there.kind = EXPLICIT
                there.doomed = False
                return there, created
            self._clear_address(view)
            entry = Entry(view.ptr, view.nbytes, view.device, EXPLICIT)
            entry.held = entry.exact = obj
            self._register(entry)
            self.entries[entry.ptr] = entry
            return entry, True

    def release(self, view: _buffers.View) -> bool:
        """Deregisters the registration at `view`'s address (now, or when
        the transfers using it end); whether there was one of this
        session's, explicit or cached."""
        with self.lock:
            self._reap()
            entry = self.entries.get(view.ptr)
            if entry is None or entry.kind not in (EXPLICIT, CACHED) or entry.dead or entry.doomed:
                return False
            entry.doomed = True
            entry.held = entry.exact = None
            self.lru.pop(entry.ptr, None)
            self._reap()
            return True

    # ------------------------------------------------------------ the session's

    def count(self) -> int:
        with self.lock:
            self._reap()
            return len(self.entries)

    def close(self) -> List[Exception]:
        """Deregisters everything; the failures."""
        failures: List[Exception] = []
        with self.lock:
            for entry in list(self.entries.values()):
                err = self.lib.hipObjBufDeregister(entry.ptr)
                if err.opError != _lib.SUCCESS:
                    failures.append(self.error("hipObjBufDeregister", err.opError, err.hipError, _describe(entry)))
            self.entries.clear()
            self.lru.clear()
        return failures

    def abandon(self) -> None:
        """In a forked child: forgets every registration (the parent's)
        without a call into the library, and never makes one again. Takes
        no lock: another thread of the parent may have held it."""
        self.abandoned = True
        self.entries = {}
        self.lru = collections.OrderedDict()


def _describe(entry: Entry) -> str:
    where = "GPU" if entry.device else "host"
    return f"{entry.nbytes} bytes of {where} memory at {entry.ptr:#x}"


class Bounce:
    """The session's one bounce buffer: read-only sources (``bytes``, a
    read-only memoryview or array) are copied into it and sent from there.
    Page-aligned anonymous memory, registered while it lasts; grown (by
    powers of two, from 1 MiB) up to `limit` bytes, never shrunk; one
    transfer at a time uses it."""

    def __init__(self, registry: Registry, limit: int):
        self.registry = registry
        self.limit = limit
        self.lock = threading.Lock()
        self.memory: Optional[mmap.mmap] = None
        self.array: Any = None
        self.entry: Optional[Entry] = None

    def capacity(self) -> int:
        return len(self.memory) if self.memory is not None else 0

    def _grow(self, nbytes: int) -> None:
        """Makes the buffer at least `nbytes`; raises
        ``RegistrationError``. Under ``self.lock``."""
        size = BOUNCE_MIN
        while size < nbytes:
            size *= 2
        size = min(size, self.limit)
        self._free()
        memory = mmap.mmap(-1, size)
        array = (ctypes.c_char * size).from_buffer(memory)
        entry = Entry(ctypes.addressof(array), size, False, BOUNCE)
        try:
            with self.registry.lock:
                self.registry._register(entry)
                self.registry.entries[entry.ptr] = entry
        except RegistrationError:
            array = None  # the mmap closes only once nothing points into it
            memory.close()
            raise
        self.memory, self.array, self.entry = memory, array, entry

    def _free(self) -> None:
        if self.entry is None:
            return
        with self.registry.lock:
            if self.registry.entries.get(self.entry.ptr) is self.entry:
                self.registry._drop(self.entry)
        self.entry = None
        self.array = None
        if self.memory is not None:
            self.memory.close()
            self.memory = None

    def too_large(self, nbytes: int) -> Optional[str]:
        """Why `nbytes` cannot go through the buffer, if they cannot."""
        if nbytes <= self.limit:
            return None
        return (
            f"a read-only source of {nbytes} bytes is larger than the bounce buffer may grow "
            f"(bounce_limit={self.limit}): pass writable memory (a bytearray, a NumPy array) "
            "to send it by RDMA, or open the session with a larger bounce_limit"
        )

    @contextlib.contextmanager
    def fill(self, data: memoryview) -> Iterator[Entry]:
        """`data` (at most `limit` bytes) copied into the buffer; its entry,
        while the transfer runs. Raises ``RegistrationError``."""
        with self.lock:
            if self.capacity() < len(data) or self.entry is None or self.entry.ptr not in self.registry.entries:
                self._grow(len(data))
            assert self.memory is not None and self.entry is not None
            self.memory[: len(data)] = data
            yield self.entry

    def abandon(self) -> None:
        """In a forked child: forgets the buffer without deregistering it
        (the registration is the parent's); a new one is made if needed."""
        self.lock = threading.Lock()
        self.entry = None
        self.array = None
        self.memory = None
