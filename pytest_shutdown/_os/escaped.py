"""Processes that left the session's tree, found by the session marker, not by adopting them.

Every program a guarded session executes inherits ``PYTEST_SHUTDOWN_SESSION=<token>``. A
re-parented one (a double fork, a shell's background job) is no longer in pytest's tree, so the
pids the kernel allocated since the last look (``ns_last_pid`` counts upwards) are looked up:
those that run, lead their thread group, are not in the tree and carry the token escaped. The
cost follows the pids allocated, never the host's process table.
"""

from __future__ import annotations

import os
import time

from pytest_shutdown._os.proc_stat import stat_fields

__all__ = ["carries_marker", "escaped_processes", "restore_watch", "watch_marker", "watching"]

#: The entry an escaped process carries (``NAME=token\0``); None: not watched.
_entry: bytes | None = None
_found: set[int] = set()
_looked_to: int | None = None
#: The tree at the last look: one that has left it since is looked at again.
_last_tree: frozenset[int] = frozenset()
#: Processes whose environment read empty (inside an exec): read again at the next look.
_unread: set[int] = set()
EXEC_PATIENCE_S = 0.25
#: More pids than this since the last look (or wrapped): one pass over ``/proc`` instead.
_RANGE_LIMIT = 4096


def watch_marker(name: str | None, token: str | None = None, since: bytes | None = None) -> object:
    """Look for processes carrying ``name=token`` from now on (None: stop looking); returns the
    previous watch, for :func:`restore_watch`. ``since``: ``ns_last_pid`` read before a new
    token was first put in the environment: the first look starts there, not with a pass over
    ``/proc``."""
    global _entry, _found, _looked_to, _last_tree, _unread
    previous = (_entry, _found, _looked_to, _last_tree, _unread)
    _entry = None if name is None or token is None else f"{name}={token}\0".encode()
    _looked_to = int(since) if since is not None and since.strip().isdigit() else None
    _found, _unread, _last_tree = set(), set(), frozenset()
    return previous


def restore_watch(previous: object) -> None:
    """Put back what :func:`watch_marker` returned."""
    global _entry, _found, _looked_to, _last_tree, _unread
    _entry, _found, _looked_to, _last_tree, _unread = previous  # type: ignore[misc]


def watching() -> bool:
    """Whether a marker is watched."""
    return _entry is not None


def carries_marker(pid: int, patience_s: float = 0.0) -> bool:
    """Whether process ``pid`` carries the watched marker in its environment."""
    return _marker_of(pid, patience_s) is True


def _marker_of(pid: int, patience_s: float) -> bool | None:
    """None when its environment reads empty for ``patience_s``: a process inside an
    ``execve`` (which a busy machine may not have run yet) shows none until it is done."""
    entry = _entry
    if entry is None:
        return False
    deadline = time.monotonic() + patience_s
    delay = 0.002
    while True:
        environ = _read_environ(pid)
        if environ is None:
            return False
        if environ:
            return entry in environ
        if time.monotonic() >= deadline or not _leads_and_runs(pid):
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _leads_and_runs(pid: int) -> bool:
    """``pid`` is a process (not a thread) and has not ended."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read(1024)
    except OSError:
        return False
    state = tgid = None
    for line in status.splitlines():
        if line.startswith(b"State:"):
            state = line.split()[1:2]
        elif line.startswith(b"Tgid:"):
            tgid = line.split()[1:2]
            break
    return tgid == [str(pid).encode()] and state not in ([b"Z"], [b"X"])


def escaped_processes(tree: frozenset[int], last_pid: bytes | None) -> frozenset[int]:
    """The session's processes outside ``tree`` (the descendants now), given ``ns_last_pid``
    read before ``tree`` was walked."""
    global _looked_to, _last_tree, _unread
    if _entry is None:
        return frozenset()
    me = os.getpid()
    try:
        now = int(last_pid) if last_pid is not None else None
    except ValueError:
        now = None
    if now is None or _looked_to is None or not 0 <= now - _looked_to <= _RANGE_LIMIT:
        candidates = [int(e) for e in _listing() if e.isdigit()]
    else:
        candidates = list(range(_looked_to + 1, now + 1))
    if now is not None:
        _looked_to = now
    candidates.extend(_last_tree - tree)
    _last_tree = tree
    again, _unread = _unread, set()
    for pid in candidates:
        if pid == me or pid in tree or not _leads_and_runs(pid) or _is_kernel_thread(pid):
            continue
        marked = _marker_of(pid, EXEC_PATIENCE_S)
        if marked:
            _found.add(pid)
        elif marked is None:
            _unread.add(pid)  # read once more, with no wait
    for pid in again - _unread:
        if pid not in tree and _leads_and_runs(pid) and carries_marker(pid):
            _found.add(pid)
    if _found:
        _found.difference_update([p for p in _found if p in tree or not _leads_and_runs(p)])
    return frozenset(_found)


def _is_kernel_thread(pid: int) -> bool:
    """A kernel thread (``PF_KTHREAD``): no environment, ever."""
    try:
        fields = stat_fields(pid)
        return fields is not None and bool(int(fields[6]) & _PF_KTHREAD)
    except (OSError, IndexError, ValueError):
        return False


_PF_KTHREAD = 0x00200000


def _read_environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _listing() -> list[str]:
    try:
        return os.listdir("/proc")
    except OSError:
        return []
