"""A shared-memory ring buffer for EngineCore → frontend outputs, in vLLM's ``MessageQueue`` shape.

One writer (the EngineCore), one reader (its parent); each batch of outputs is pickled into the
next slot and a one-item message on the control connection wakes the reader. A batch that does
not fit, or finds the ring full, goes over the connection instead; the reader drains the ring
before it handles any message, so outputs keep their order.

The parent names the segment, the child creates it and unlinks it when it ends normally; the
parent unlinks it too, since a SIGKILLed child cleans nothing (vLLM #51579). Neither registers
it with the resource tracker (as vLLM): the tracker would start a helper process per engine tree
and unlink the segment behind its owners' backs.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import struct
import sys
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from typing import Any

__all__ = ["ShmRing", "segment_name", "unlink_segment"]

#: Name prefix of the reference engine's segments: ``psd_<pid of the naming process>_...``.
PREFIX = "psd_"
_MAGIC = 0x50534452  # "PSDR"
# magic, slots, slot size, then the write and read counters (each alone in its cache line)
_HEADER = struct.Struct("<III")
_COUNTER = struct.Struct("<Q")
_WRITE_AT = 64
_READ_AT = 128
_SLOTS_AT = 192
_LENGTH = struct.Struct("<I")

#: Default geometry: 64 slots of 64 KiB (4 MiB), enough for a few seconds of reference outputs.
DEFAULT_SLOTS = 64
DEFAULT_SLOT_BYTES = 64 * 1024


def segment_name(tag: str) -> str:
    """A fresh segment name that carries this process's pid (the one that must unlink it)."""
    return f"{PREFIX}{os.getpid()}_{tag}_{secrets.token_hex(4)}"


@contextlib.contextmanager
def _untracked() -> Iterator[None]:
    """Python < 3.13 registers even an attach with the resource tracker."""
    original = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        resource_tracker.register = original  # type: ignore[assignment]


def _open(name: str, create: bool, size: int) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, create=create, size=size, track=False)
    with _untracked():
        return shared_memory.SharedMemory(name, create=create, size=size)


def unlink_segment(name: str) -> bool:
    """Unlink the segment ``name`` if it exists; True when this call removed it."""
    try:
        os.unlink(os.path.join("/dev/shm", name.lstrip("/")))
    except OSError:
        return False
    return True


class ShmRing:
    """One-writer one-reader ring of pickled items in a shared-memory segment."""

    def __init__(self, shm: shared_memory.SharedMemory) -> None:
        self._shm = shm
        buf = shm.buf
        assert buf is not None
        self._buf: memoryview = buf
        self.name = shm.name.lstrip("/")
        magic, self.slots, self.slot_bytes = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC:
            raise ValueError(f"shared-memory segment {self.name!r} is not a ring buffer")
        self._closed = False

    @classmethod
    def create(
        cls, name: str, slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES
    ) -> ShmRing:
        if slots < 1 or slot_bytes <= _LENGTH.size:
            raise ValueError(f"slots/slot_bytes: expected >= 1 and > 4, got {slots}/{slot_bytes}")
        shm = _open(name, True, _SLOTS_AT + slots * slot_bytes)
        buf = shm.buf
        assert buf is not None
        _HEADER.pack_into(buf, 0, _MAGIC, slots, slot_bytes)
        _COUNTER.pack_into(buf, _WRITE_AT, 0)
        _COUNTER.pack_into(buf, _READ_AT, 0)
        del buf
        return cls(shm)

    @classmethod
    def attach(cls, name: str) -> ShmRing:
        return cls(_open(name, False, 0))

    def _counter(self, at: int) -> int:
        return int(_COUNTER.unpack_from(self._buf, at)[0])

    def put(self, item: Any) -> bool:
        """False (nothing written) when ``item`` does not fit a slot or the ring is full."""
        if self._closed:
            return False
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) + _LENGTH.size > self.slot_bytes:
            return False
        try:
            return self._write(data)
        except (ValueError, BufferError, OSError):  # closed under a late writer
            return False

    def _write(self, data: bytes) -> bool:
        written = self._counter(_WRITE_AT)
        if written - self._counter(_READ_AT) >= self.slots:
            return False
        at = _SLOTS_AT + (written % self.slots) * self.slot_bytes
        buf = self._buf
        _LENGTH.pack_into(buf, at, len(data))
        buf[at + _LENGTH.size : at + _LENGTH.size + len(data)] = data
        _COUNTER.pack_into(buf, _WRITE_AT, written + 1)  # published after the payload
        return True

    def get_all(self) -> list[Any]:
        if self._closed:
            return []
        buf = self._buf
        read = self._counter(_READ_AT)
        written = self._counter(_WRITE_AT)
        items = []
        while read < written:
            at = _SLOTS_AT + (read % self.slots) * self.slot_bytes
            (length,) = _LENGTH.unpack_from(buf, at)
            items.append(pickle.loads(bytes(buf[at + _LENGTH.size : at + _LENGTH.size + length])))
            read += 1
            _COUNTER.pack_into(buf, _READ_AT, read)
        return items

    def close(self) -> None:
        """Unmap the segment (idempotent); the name stays until someone unlinks it."""
        if self._closed:
            return
        self._closed = True
        self._buf.release()
        with contextlib.suppress(BufferError, OSError):
            self._shm.close()

    def unlink(self) -> bool:
        return unlink_segment(self.name)
