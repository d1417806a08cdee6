"""Cheap change detectors shared by the OS-resource kinds (one ``fstat`` each).

* the number of open file descriptors of this process: ``st_size`` of ``/proc/self/fd``
  (Linux >= 6.2; older kernels report 0 and the fd kind lists the folder instead);
* the state of ``/dev/shm``: its modification time and size (tmpfs counts its entries in a
  folder's size; a create or an unlink changes both).

Both folders are kept open (close-on-exec) so that a check is one ``fstat``; a forked child
closes its copies at once (a fork inherits nothing of the plugin).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from pytest_shutdown.moments import reading

__all__ = ["FD_DIR", "SHM_DIR", "fd_count", "settle_left", "shm_state"]

T = TypeVar("T")

FD_DIR = "/proc/self/fd"
SHM_DIR = "/dev/shm"

_lock = threading.Lock()
_handles: dict[str, int] = {}
_pid = 0


def _close_all_in_child() -> None:
    for fd in list(_handles.values()):
        try:
            os.close(fd)
        except OSError:
            pass
    _handles.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_all_in_child)


def _handle(path: str) -> int | None:
    global _pid
    fd = _handles.get(path)
    if fd is not None and _pid == os.getpid():
        return fd
    with _lock:
        if _pid != os.getpid():
            _handles.clear()
            _pid = os.getpid()
        fd = _handles.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return None
            _handles[path] = fd
    return fd


def own_handles() -> frozenset[int]:
    """The descriptors this module holds (never a test's)."""
    return frozenset(_handles.values()) if _pid == os.getpid() else frozenset()


def fd_count() -> int | None:
    """Open descriptors of this process now; None where the kernel does not count them."""
    return reading("fd_count", _read_fd_count)


def _read_fd_count() -> int | None:
    fd = _handle(FD_DIR)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
    except OSError:
        return None
    return size if size > 0 else None


def shm_state() -> tuple[int, int] | None:
    """(mtime_ns, size) of ``/dev/shm``; None where it does not exist."""
    return reading("shm_state", _read_shm_state)


def _read_shm_state() -> tuple[int, int] | None:
    fd = _handle(SHM_DIR)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def settle_left(
    items: Sequence[T], still_there: Callable[[Sequence[T]], list[T]], deadline: float
) -> list[T]:
    """What ``still_there`` still finds at ``deadline``: a dropped object releases its resource
    when collected, so one ``gc.collect()`` when something is left, then short polls."""
    left = still_there(items)
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
