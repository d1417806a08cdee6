"""A shared-memory ring buffer whose ``close()`` forgets ``unlink()``: every one stays in /dev/shm.

The most common Python shared-memory leak. ``SharedMemory.close()`` only unmaps this process's
view; the segment lives on in ``/dev/shm`` until someone calls ``unlink()``. An engine that makes
a ring per request batch (vLLM's multimodal inputs go through ``vllm_mm_<uuid>`` segments) and
closes each without unlinking fills ``/dev/shm`` (a container's default is 64 MiB), after which
``SharedMemory(create=True)`` fails with "No space left on device". The segment's name carries no
pid and no process holds it any more: only the recorded creation ties it to the code that made
it, and the finding names that line. Fixed by unlinking in the creator's ``close()``.
"""

from __future__ import annotations

import struct
import uuid
from multiprocessing import shared_memory

import pytest

from pytest_shutdown import ShutdownContractError, no_os_leaks

SLOTS = 4
SLOT_BYTES = 256
_HEADER = struct.Struct("<QQ")  # write index, read index


class BuggyRing:
    """A single-producer ring buffer in one segment; ``close()`` unmaps and forgets it."""

    def __init__(self) -> None:
        size = _HEADER.size + SLOTS * SLOT_BYTES
        self.shm = shared_memory.SharedMemory(
            name=f"vllm_mm_{uuid.uuid4()}", create=True, size=size
        )
        self.name = self.shm.name
        self.buf: memoryview = self.shm.buf  # type: ignore[assignment]
        _HEADER.pack_into(self.buf, 0, 0, 0)

    def put(self, data: bytes) -> None:
        write, read = _HEADER.unpack_from(self.buf, 0)
        if write - read >= SLOTS or len(data) > SLOT_BYTES:
            raise BufferError("ring full or item too large")
        start = _HEADER.size + (write % SLOTS) * SLOT_BYTES
        self.buf[start : start + len(data)] = data
        _HEADER.pack_into(self.buf, 0, write + 1, read)

    def close(self) -> None:
        self.buf.release()
        self.shm.close()  # the bug: the segment stays in /dev/shm


class FixedRing(BuggyRing):
    def close(self) -> None:
        self.buf.release()
        self.shm.close()
        self.shm.unlink()  # the fix: the creator removes the name


def expect(code: str, error: ShutdownContractError, name: str) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (segment,) = error.findings[0].details["segments"]
    assert segment["name"] == name.lstrip("/") and segment["holders"] == []
    assert segment["site"].endswith(f"{__name__.rpartition('.')[2]}.py:{_CREATED_AT}")
    raise error


#: The line in ``BuggyRing.__init__`` that creates the segment (the finding names it).
_CREATED_AT = BuggyRing.__init__.__code__.co_firstlineno + 2


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="the segment stays")
def test_buggy_ring_leaves_its_segment_after_close() -> None:
    ring = None
    try:
        with no_os_leaks(fds=False, ports=False, grace=0.2):
            ring = BuggyRing()
            ring.put(b"request 1")
            ring.close()
    except ShutdownContractError as error:
        assert ring is not None
        expect("shm-leak", error, ring.name)
    finally:
        if ring is not None:
            ring.shm.unlink()


def test_fixed_ring_unlinks_its_segment_at_close() -> None:
    with no_os_leaks(fds=False, ports=False, grace=0.2):
        ring = FixedRing()
        ring.put(b"request 1")
        ring.close()
