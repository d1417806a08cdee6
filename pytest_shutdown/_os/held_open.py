"""Files of ``/proc`` (and ``/dev/shm``) held open, so that a reading is one system call.

The guard reads a few counters before and after every test: this process's open descriptors
(``fstat`` of ``/proc/self/fd``), ``/dev/shm``'s state (its ``fstat``), the last pid the kernel
allocated (``pread`` of ``ns_last_pid``). Opening
and closing each file per reading would cost three system calls instead of one. The handles are
close-on-exec, left out of the fd kind's findings (:func:`held_open_fds`), and a forked child
closes its copies at once: they name the parent's ``/proc/self``, and a fork inherits nothing
of the plugin.
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
    """The descriptor of ``path`` held open by this module (opened on first use); None when it
    cannot be opened here."""
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
    """The first ``size`` bytes of the file ``path`` now (one ``pread`` of the held handle)."""
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
