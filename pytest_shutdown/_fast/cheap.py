"""Cheap readings the resource kinds share, and their settling.

* the number of open descriptors: ``st_size`` of ``/proc/self/fd`` (Linux >= 6.2; older kernels
  report 0 and the fd kind lists the folder), with the lowest free descriptor number;
* the state of ``/dev/shm``: its modification time and size (a create or an unlink changes both).

Each is an ``fstat`` of a folder held open (:mod:`pytest_shutdown._fast.held_open`), read once per
:func:`pytest_shutdown._fast.moments.one_moment`.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from itertools import compress
from typing import TypeVar

from pytest_shutdown._fast.held_open import held_open
from pytest_shutdown._fast.moments import reading

__all__ = [
    "FD_DIR",
    "SHM_DIR",
    "collect_young",
    "fd_count",
    "heap_instances",
    "lowest_free_fd",
    "process_name",
    "self_maps",
    "settle_left",
    "settle_listed",
    "shm_state",
    "socket_inode",
]

T = TypeVar("T")

FD_DIR = "/proc/self/fd"
SHM_DIR = "/dev/shm"


def fd_count() -> int | None:
    """Open descriptors of this process now; None where the kernel does not count them."""
    return reading("fd_count", _read_fd_count)


def _read_fd_count() -> int | None:
    fd = held_open(FD_DIR)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
    except OSError:
        return None
    return size if size > 0 else None


def lowest_free_fd() -> int | None:
    """The number the next descriptor opened here would take (a ``dup``, closed at once); None
    when it cannot be taken. With the count it tells a test that swapped one descriptor for
    another (the count as it was, the lowest free number moved)."""
    held = held_open(FD_DIR)
    if held is None:
        return None
    try:
        probe = os.dup(held)
    except OSError:
        return None
    os.close(probe)
    return probe


def shm_state() -> tuple[int, int] | None:
    """(mtime_ns, size) of ``/dev/shm``; None where it does not exist."""
    return reading("shm_state", _read_shm_state)


def _read_shm_state() -> tuple[int, int] | None:
    fd = held_open(SHM_DIR)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def heap_instances(accept: Callable[[type], bool]) -> list[object]:
    """The heap's objects whose type ``accept`` takes, decided once per type and selected in C
    (a Python loop over the heap took 18 ms of 35)."""
    objects = gc.get_objects()
    types = {kind for kind in set(map(type, objects)) if accept(kind)}
    return list(compress(objects, map(types.__contains__, map(type, objects))))


def collect_young() -> None:
    """Collect gc's young generations once per moment (a fraction of a millisecond; a full
    collection takes tens with numpy loaded): what a test dropped in a cycle lately is released
    before anyone scans the heap for who holds it."""
    reading("collect_young", _collect_young)


def _collect_young() -> bool:
    gc.collect(1)
    return True


def settle_listed(
    items: Sequence[T],
    still_there: Callable[[Sequence[T]], list[T]],
    deadline: float,
    *,
    thorough: bool,
) -> list[T]:
    """What of the long-lived list is still there at session end, after the young generations'
    collection; with ``thorough`` (the list fails the session), as :func:`settle_left`."""
    if thorough:
        return settle_left(items, still_there, deadline)
    left = still_there(items)
    if left:
        gc.collect(1)
        left = still_there(left)
    return left


def settle_left(
    items: Sequence[T], still_there: Callable[[Sequence[T]], list[T]], deadline: float
) -> list[T]:
    """What ``still_there`` still finds at ``deadline``: a dropped object releases its resource
    when collected, so the young generations are collected, then the whole heap, then polls."""
    left = still_there(items)
    if not left:
        return left
    gc.collect(1)
    left = still_there(left)
    if not left:
        return left
    gc.collect()
    left = still_there(left)
    delay = 0.005
    while left and time.monotonic() < deadline:
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)
        left = still_there(left)
    return left


def socket_inode(link: str) -> int | None:
    """``socket:[123]`` (a ``/proc/PID/fd`` link) → 123; None for anything else."""
    if link.startswith("socket:[") and link.endswith("]"):
        try:
            return int(link[8:-1])
        except ValueError:
            return None
    return None


def self_maps() -> bytes:
    """``/proc/self/maps``; empty where it cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read()
    except OSError:
        return b""


def process_name(pid: int) -> str:
    """The kernel's name of ``pid`` (``/proc/PID/comm``); ``"?"`` when gone."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"
