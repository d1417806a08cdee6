"""Every kind's fingerprint in one pass: what the guard compares around each test.

Asking each kind for its ``fingerprint()`` costs a chain of Python calls per kind (about 66 k
instructions for the ten kinds, twice per test). Most fingerprints are one shared reading the
kind names in its ``mark``; :class:`FingerprintPass` takes each once, the system call inline:

==================  =======================================================================
``mark``            the reading
==================  =======================================================================
``"threads"``       copies of ``threading``'s tables of started and starting threads
``"last_pid"``      ``ns_last_pid`` (nothing is created anywhere without moving it), with
                    the count of threads this process started: when every pid allocated
                    between two readings went to those threads or to tasks not ours,
                    :meth:`FingerprintPass.moved` names none of these kinds
``"childless"``     while the last scan at this ``ns_last_pid`` is current: its empty
                    descendants, or ``(descendants, False)`` while no child has ended
                    (one ``waitid``); else the kind's own
``"freeze_count"``  ``gc.get_freeze_count()``
``"fd_count"``      ``st_size`` of ``/proc/self/fd`` with the lowest free descriptor number
``"shm_state"``     ``/dev/shm``'s modification time and size
``"atexit_count"``  the registrations recorded so far (the kind's ``mark_reading``)
``"c10d"``          the initialised process groups' names (the kind's ``mark_reading``)
==================  =======================================================================

Marks are only compared with another pass's marks: equal means no kind's fingerprint moved.
They may move when no fingerprint did (a reading unreadable once): the guard then asks every
kind, which costs time, never a finding. A forked child reads afresh.

The pass imports nothing above it: the descendant readings behind ``"last_pid"`` and
``"childless"`` are :data:`DESCENDANTS`, set by the resources layer's primitives when they are
imported (every kind with one of those marks imports them); without them those kinds are asked
themselves.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from pytest_shutdown._fast.cheap import FD_DIR, SHM_DIR
from pytest_shutdown._fast.held_open import held_open
from pytest_shutdown._fast.moments import one_moment

__all__ = ["DESCENDANTS", "MARKS", "DescendantReadings", "FingerprintPass"]

MARKS = (
    "threads",
    "last_pid",
    "childless",
    "freeze_count",
    "fd_count",
    "shm_state",
    "atexit_count",
    "c10d",
)
_LAST_PID_PATH = "/proc/sys/kernel/ns_last_pid"
#: The marks read by calling the kind's ``mark_reading``.
_CALLED = ("atexit_count", "c10d")


class DescendantReadings(NamedTuple):
    """The resources layer's readings behind the ``"last_pid"`` and ``"childless"`` marks
    (:mod:`pytest_shutdown.resources.primitives` has their documentation)."""

    threads_started: Callable[[], int]
    cached_descendants: Callable[[bytes], frozenset[int] | None]
    descendant_pids: Callable[[], frozenset[int]]
    descendants_if_nothing_of_ours: Callable[[bytes, int], frozenset[int] | None]
    nothing_of_ours_since: Callable[[bytes, int, bytes, AbstractSet[int] | None], bool]


#: Set by :mod:`pytest_shutdown.resources.primitives` when it is imported.
DESCENDANTS: DescendantReadings | None = None
#: Bumped in a forked child: the pass's held descriptors are the parent's, closed there.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)


def _children_all_running() -> bool:
    """Whether this process has children and none has ended (no child: the last scan's
    descendants are gone)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except (AttributeError, OSError):  # no child (ChildProcessError), or no waitid here
        return False


def _thread_tables() -> tuple[dict[Any, Any], dict[Any, Any]] | None:
    active, limbo = getattr(threading, "_active", None), getattr(threading, "_limbo", None)
    if isinstance(active, dict) and isinstance(limbo, dict):
        return active, limbo
    return None  # another threading: the kind's own fingerprint (enumerate)


class FingerprintPass:
    """The fingerprints of ``kinds`` as one list, read in one call (see the module docstring)."""

    def __init__(self, kinds: Sequence[Any]) -> None:
        self.kinds = list(kinds)
        self._open()

    def _open(self) -> None:
        self._forks = _forks
        by_mark: dict[str, list[Any]] = {}
        for kind in self.kinds:
            mark = kind.mark
            by_mark.setdefault(mark if mark in MARKS else "", []).append(kind)
        tables = _thread_tables() if "threads" in by_mark else None
        self._threads = tables
        last_pid_fd = held_open(_LAST_PID_PATH, directory=False)
        self._last_pid_fd = last_pid_fd
        self._fd_fd = held_open(FD_DIR) if "fd_count" in by_mark else None
        self._shm_fd = held_open(SHM_DIR) if "shm_state" in by_mark else None
        self._freeze = "freeze_count" in by_mark
        self._childless = by_mark.get("childless", [])
        #: Kinds read through ns_last_pid, asked themselves when it cannot be read.
        self._by_last_pid = by_mark.get("last_pid", []) + self._childless
        self._fds = by_mark.get("fd_count", [])
        self._shm = by_mark.get("shm_state", [])
        own = by_mark.get("", [])
        if tables is None:
            own += by_mark.get("threads", [])
        self._descendants = DESCENDANTS
        if last_pid_fd is None or self._descendants is None:
            own += self._by_last_pid
            self._by_last_pid = []
        if self._fd_fd is None:
            own += self._fds
            self._fds = []
        if self._shm_fd is None:
            own += self._shm  # no /dev/shm here: the kind's fingerprint says so
            self._shm = []
        #: Kinds asked themselves: those sharing no reading outside a moment, the rest inside.
        self._alone = [kind for kind in own if kind.reads_alone]
        self._alone_reads = [kind.fingerprint for kind in self._alone]
        #: One reading per called mark, standing for every kind that names it.
        self._called = [(mark, by_mark[mark]) for mark in _CALLED if mark in by_mark]
        self._called_reads = [kinds[0].mark_reading for _, kinds in self._called]
        self._own = [kind for kind in own if kind not in self._alone]
        self._owners = self._positions(by_mark)

    def _positions(self, by_mark: dict[str, list[Any]]) -> list[tuple[str, ...]]:
        """The names of the kinds each position of :meth:`read`'s list stands for (while
        ``ns_last_pid`` can be read, at ``_marker_at``)."""

        def names(kinds: list[Any]) -> tuple[str, ...]:
            return tuple(kind.name for kind in kinds)

        owners: list[tuple[str, ...]] = []
        self._marker_at: int | None = None
        if self._threads is not None:
            owners += [names(by_mark["threads"])] * 2
        if self._by_last_pid:
            self._marker_at = len(owners)
            owners.append(names(self._by_last_pid))
            owners.append(())  # the threads started: no kind's, read with the marker
            owners += [(kind.name,) for kind in self._childless]
        if self._freeze:
            owners.append(names(by_mark["freeze_count"]))
        if self._fds:
            owners.append(names(self._fds))
        if self._shm:
            owners.append(names(self._shm))
        owners += [names(kinds) for _, kinds in self._called]
        owners += [(kind.name,) for kind in self._alone + self._own]
        return owners

    def moved(self, before: list[Any], after: list[Any]) -> set[str] | None:
        """The names of the kinds whose fingerprints may have moved between two readings;
        None when the readings cannot be told apart by kind (then every kind may have)."""
        owners = self._owners
        if len(before) != len(owners) or len(after) != len(owners):
            return None
        at = self._marker_at
        if at is not None and (before[at] is None or after[at] is None):
            return None  # ns_last_pid unreadable: the kinds behind it were asked instead
        # No task created since is ours: nothing the ns_last_pid kinds look for was created.
        readings = self._descendants
        threads_only = (
            at is not None
            and readings is not None
            and before[at] != after[at]
            and readings.nothing_of_ours_since(
                before[at], before[at + 1], after[at], readings.cached_descendants(after[at])
            )
        )
        moved: set[str] = set()
        for position, (names, old, new) in enumerate(zip(owners, before, after, strict=True)):
            if threads_only and position == at:
                continue
            try:
                same = old is new or bool(old == new)
            except Exception:  # noqa: BLE001 - a hostile __eq__ in process-wide state
                same = False
            if not same:
                moved.update(names)
        return moved

    def read(self) -> list[Any]:
        """The marks now; equal to another reading's when no kind's fingerprint moved."""
        if self._forks != _forks:
            self._open()
        marks: list[Any] = []
        if self._threads is not None:
            active, limbo = self._threads
            marks.append(active.copy())
            marks.append(limbo.copy())
        if self._by_last_pid:
            readings: DescendantReadings = self._descendants  # type: ignore[assignment]
            started = readings.threads_started()  # before the marker: a later one is not ours
            try:
                marker: bytes | None = os.pread(self._last_pid_fd, 32, 0)  # type: ignore[arg-type]
            except OSError:
                marker = None
            marks.append(marker)
            marks.append(started)
            if marker is None:
                marks.extend(self._fingerprints(self._by_last_pid))
            elif self._childless:
                known = readings.cached_descendants(marker)
                if known is None:  # no scan at this marker: the last kept, or one made now
                    known = readings.descendants_if_nothing_of_ours(marker, started)
                if known is None:
                    readings.descendant_pids()
                    known = readings.cached_descendants(marker)
                if known is not None and not known:
                    marks += [known] * len(self._childless)  # what each would answer
                elif known is not None and _children_all_running():
                    marks += [(known, False)] * len(self._childless)  # the same
                else:
                    marks.extend(self._fingerprints(self._childless))
        if self._freeze:
            marks.append(gc.get_freeze_count())
        if self._fds:
            try:
                count = os.fstat(self._fd_fd).st_size  # type: ignore[arg-type]
            except OSError:
                count = 0
            if count > 0:  # with the lowest free number (cheap.lowest_free_fd, inline)
                try:
                    lowest = os.dup(self._fd_fd)  # type: ignore[arg-type]
                except OSError:
                    marks.append((count, None))
                else:
                    os.close(lowest)
                    marks.append((count, lowest))
            else:
                marks.append(self._fingerprints(self._fds))
        if self._shm:
            try:
                st = os.fstat(self._shm_fd)  # type: ignore[arg-type]
                marks.append((st.st_mtime_ns, st.st_size))
            except OSError:
                marks.append(None)
        for read_called in self._called_reads:
            marks.append(read_called())
        for read_alone in self._alone_reads:
            marks.append(read_alone())
        if self._own:
            marks.extend(self._fingerprints(self._own))
        return marks

    @staticmethod
    def _fingerprints(kinds: list[Any]) -> list[Any]:
        with one_moment():  # the kinds share their readings (descendants, child state ...)
            return [kind.fingerprint() for kind in kinds]
