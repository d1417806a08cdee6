"""Files of ``/proc`` (and ``/dev/shm``) held open, so that a reading is one system call, not
three. The handles are close-on-exec, never a finding (:func:`held_open_fds`), and closed in a
forked child (they name the parent's ``/proc/self``).
"""

from __future__ import annotations

import os
import threading

__all__ = ["held_open", "held_open_fds", "read_held"]

_lock = threading.Lock()
_handles: dict[str, int] = {}


def _close_all_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for fd in list(_handles.values()):
        try:
            os.close(fd)
        except OSError:
            pass
    _handles.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_all_in_child)


def held_open(path: str, *, directory: bool = True) -> int | None:
    """The descriptor of ``path`` held open (opened on first use); None when it cannot be."""
    fd = _handles.get(path)
    if fd is not None:
        return fd
    with _lock:
        fd = _handles.get(path)
        if fd is None:
            flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
            try:
                fd = os.open(path, flags)
            except OSError:
                return None
            _handles[path] = fd
    return fd


def read_held(path: str, size: int = 64) -> bytes | None:
    """The first ``size`` bytes of the file ``path`` now."""
    fd = held_open(path, directory=False)
    if fd is None:
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None


def held_open_fds() -> frozenset[int]:
    """The descriptors this module holds (never a test's)."""
    return frozenset(_handles.values())
