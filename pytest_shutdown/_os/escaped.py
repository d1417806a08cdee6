"""Processes that left the session's tree, found by the session marker, not by adopting them.

Every program a guarded session executes inherits ``PYTEST_SHUTDOWN_SESSION=<token>``. A
re-parented one (a double fork, a shell's background job) is no longer in pytest's tree, so the
pids the kernel allocated since the last look (``ns_last_pid`` counts upwards) are looked up:
those that run, lead their thread group, are not in the tree and carry the token escaped. The
cost follows the pids allocated, never the host's process table; a pid whose parent could not
have adopted a process of the session (:func:`may_parent_escaped`) costs one read of its
``stat``, so a host busy with processes of its own costs little.
"""

from __future__ import annotations

import os
import time

from pytest_shutdown._fast.held_open import read_held
from pytest_shutdown._os.proc_stat import stat_fields

__all__ = [
    "carries_marker",
    "escaped_processes",
    "last_allocated_pid",
    "may_parent_escaped",
    "restore_watch",
    "watch_marker",
    "watching",
]

#: The last pid the kernel allocated in this pid namespace: while it has not moved, no process
#: (nor thread) was created anywhere.
LAST_PID_PATH = "/proc/sys/kernel/ns_last_pid"
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
#: ``(pid, ppid, ancestors)``: this process's ancestors, read again when either pid changes.
_ancestry: tuple[int, int, frozenset[int]] | None = None


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


def last_allocated_pid() -> bytes | None:
    """``ns_last_pid`` (its file held open: one ``pread``); None where it cannot be read. Read
    before a new token goes into the environment, it is where the first look can start
    (:func:`watch_marker`'s ``since``)."""
    return read_held(LAST_PID_PATH, 32)


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


def may_parent_escaped(parent: int, tree: frozenset[int] = frozenset()) -> bool:
    """Whether a process whose parent is ``parent`` may be one of the session's that left its
    tree. An orphan is adopted by the nearest child subreaper among the ancestors of the process
    that ended, else by the namespace's init: for a descendant of this process, this process,
    one of its ancestors or pid 1. A process created by one still in the ``tree`` (a race with
    the walk) or by an escaped one (its workers) is the session's too. Any other parent is a
    process outside the session, whose children are not the session's."""
    return (
        parent <= 1 or parent in tree or parent in _found or parent in _ancestors_of_this_process()
    )


def _ancestors_of_this_process() -> frozenset[int]:
    """This process and its ancestors, up to pid 1 (read from ``/proc/PID/stat``)."""
    global _ancestry
    me, parent = os.getpid(), os.getppid()
    if _ancestry is not None and _ancestry[:2] == (me, parent):
        return _ancestry[2]
    chain = {me}
    pid = parent
    while pid > 1 and pid not in chain and len(chain) < 256:
        chain.add(pid)
        try:
            fields = stat_fields(pid)
            pid = int(fields[1]) if fields else 0
        except (OSError, IndexError, ValueError):
            break
    _ancestry = (me, parent, frozenset(chain))
    return _ancestry[2]


def _outside_the_session(pid: int, tree: frozenset[int]) -> bool:
    """``pid`` is gone, has ended, is a kernel thread, or is the child of a process that could
    not have adopted one of the session's (one read of its ``stat``)."""
    try:
        fields = stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X", "x"):
            return True
        if int(fields[6]) & _PF_KTHREAD:
            return True  # no environment, ever
        return not may_parent_escaped(int(fields[1]), tree)
    except (OSError, IndexError, ValueError):
        return False  # unreadable: looked at as before


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
        if pid == me or pid in tree or _outside_the_session(pid, tree):
            continue
        if not _leads_and_runs(pid):
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
