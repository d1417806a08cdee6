"""Containment: nothing a test starts can hide from the guard by being re-parented.

While the guard is on, the environment carries ``PYTEST_SHUTDOWN_SESSION=<token>``, inherited
by every program a test executes: a descendant re-parented to PID 1 (a double fork,
``sh -c 'cmd &'``) is found by it among the pids allocated since the last look
(:mod:`pytest_shutdown._os.escaped`).

``--shutdown-containment=subreaper`` (opt-in, Linux) makes pytest a *child subreaper* instead:
orphans become pytest's, so one forked without an ``exec`` is found too; not the default, as
it changes what a test sees (``os.waitpid`` on an orphan succeeds). The guard reaps the adopted
zombies no ``subprocess``/``multiprocessing`` object will. Other platforms: neither
(docs/limits.md).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from pytest_shutdown._os import escaped
from pytest_shutdown._os.prctl import (
    PR_GET_CHILD_SUBREAPER,
    PR_SET_CHILD_SUBREAPER,
    prctl,
    prctl_get_int,
)
from pytest_shutdown._os.proc_stat import read_stat, stat_fields

__all__ = [
    "SESSION_MARKER_ENV",
    "Containment",
    "first_ancestor",
    "reap_adopted",
    "started_in_test",
    "stat_fields",
]

SESSION_MARKER_ENV = "PYTEST_SHUTDOWN_SESSION"


def _subreaper_now() -> bool | None:
    value = prctl_get_int(PR_GET_CHILD_SUBREAPER)
    return None if value is None else bool(value)


class Containment:
    """The session's containment: subreaper flag and environment marker, put back on release."""

    __slots__ = ("token", "subreaper", "_was_subreaper", "_old_marker", "_pid", "_old_watch")

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()
        self.subreaper = False
        self._was_subreaper: bool | None = None
        self._old_marker: str | None = None
        self._pid = os.getpid()
        self._old_watch: object = None

    def __repr__(self) -> str:
        return f"Containment(token={self.token!r}, subreaper={self.subreaper!r})"

    def engage(self, *, subreaper: bool = False) -> Containment:
        """Mark the environment; with ``subreaper``, become a child subreaper (Linux), else
        watch for the marker in processes that leave the tree."""
        self._was_subreaper = _subreaper_now()
        if self._was_subreaper:
            self.subreaper = True  # an inline pytester run inside a subreaper's run
        elif subreaper and sys.platform.startswith("linux"):
            self.subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
        self._old_marker = os.environ.get(SESSION_MARKER_ENV)
        # No process can carry the new token before it is in the environment: the first look
        # starts at the pid allocated last, not with a pass over /proc.
        since = escaped.last_allocated_pid()
        os.environ[SESSION_MARKER_ENV] = self.token
        if not self.subreaper and sys.platform.startswith("linux"):
            self._old_watch = escaped.watch_marker(SESSION_MARKER_ENV, self.token, since)
        return self

    def release(self) -> None:
        """Put the flag, the watch and the environment back."""
        if os.getpid() != self._pid:
            return
        if self.subreaper and self._was_subreaper is False:
            prctl(PR_SET_CHILD_SUBREAPER, 0)
        if self._old_watch is not None:
            escaped.restore_watch(self._old_watch)
            self._old_watch = None
        if os.environ.get(SESSION_MARKER_ENV) == self.token:
            if self._old_marker is None:
                os.environ.pop(SESSION_MARKER_ENV, None)
            else:
                os.environ[SESSION_MARKER_ENV] = self._old_marker

    def marked(self, pid: int) -> bool:
        """Whether ``pid`` carries this session's marker in its environment."""
        environ = escaped._read_environ(pid) or b""
        return f"{SESSION_MARKER_ENV}={self.token}\0".encode() in environ

    def stray_marked(self, exclude: Iterable[int] = ()) -> list[int]:
        """Processes carrying the marker (one pass over ``/proc``, at session end only)."""
        if not sys.platform.startswith("linux"):
            return []
        skip = set(exclude) | {os.getpid()}
        found = []
        for entry in escaped._listing():  # empty where /proc cannot be read
            if entry.isdigit() and int(entry) not in skip and self.marked(int(entry)):
                found.append(int(entry))
        return found


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return stat_fields(pid)
    except OSError:
        return None


def is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("Z", "X")


def exit_signal(pid: int) -> int | None:
    """The signal that ended a zombie ``pid`` (stat field 52); None otherwise."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] not in ("Z", "X") or len(fields) < 50:
        return None
    try:
        status = int(fields[49])
    except ValueError:
        return None
    sig = status & 0x7F
    return sig if sig and sig != 0x7F else None


def reap_adopted(pids: Iterable[int]) -> list[int]:
    """Reap those of ``pids`` that are this process's zombie children no Popen/Process object
    owns (the orphans the subreaper adopted); returns the pids reaped."""
    from pytest_shutdown.ownership import origins  # noqa: PLC0415

    me = os.getpid()
    reaped = []
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is None or fields[0] != "Z" or int(fields[1]) != me:
            continue
        if origins.process_object(pid) is not None:
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
        except ChildProcessError:
            continue
    return reaped


def started_in_test(pid: int) -> str | None:
    """The test a program was executed in (its inherited ``PYTEST_CURRENT_TEST``)."""
    return _test_named_in(escaped._read_environ(pid))


def _test_named_in(environ: bytes | None) -> str | None:
    for entry in (environ or b"").split(b"\0"):
        if entry.startswith(b"PYTEST_CURRENT_TEST="):
            return entry.partition(b"=")[2].decode(errors="replace")
    return None


def first_ancestor(pid: int, test: str | None = None) -> tuple[int, str] | None:
    """The recorded process (started during ``test``, or any) this re-parented ``pid`` most
    likely descends from, and how: its session or group leader, else the last one before it
    (none for our own child, not re-parented: it descends from us)."""
    from pytest_shutdown.ownership import origins  # noqa: PLC0415

    fields = _stat_fields(pid)
    recorded = origins.recorded_processes(test) or origins.recorded_processes(None)
    if fields is None or not recorded:
        return None
    pgid, sid = int(fields[2]), int(fields[3])
    for candidate in recorded:
        if candidate == sid and candidate != pid:
            return candidate, "session leader"
        if candidate == pgid and candidate != pid:
            return candidate, "process group leader"
    if int(fields[1]) == os.getpid() and not _subreaper_now():
        return None  # forked here (by code no start record knows): no other recorded process's
    # A recorded time precedes the fork: never after anything the process started. The 0.05 s
    # is for the tick resolution of ``pid``'s start time.
    started = _started_at(pid)
    before = [
        c for c, at in recorded.items() if c != pid and (started is None or at <= started + 0.05)
    ]
    return (max(before, key=recorded.__getitem__), "started before it") if before else None


def _started_at(pid: int) -> float | None:
    process = read_stat(pid)
    age = process.age_s() if process is not None else None
    return None if age is None else time.time() - age
