"""The exit never hangs on a test's thread (fail mode).

The interpreter's exit joins every non-daemon thread: forever, if a leaked one never ends.
:func:`bound_the_exit` gives such threads the grace, then takes those still running out of that
final join, so that atexit callbacks, coverage data and other plugins' exit work all still run.
Up to Python 3.12 the thread's lock is removed from ``threading._shutdown_locks``; from 3.13,
where ``_thread._shutdown()`` cannot skip one, ``threading._thread_shutdown`` is replaced by a
join of the other non-daemon threads ``threading.enumerate()`` lists. Only where neither is
possible a daemon watchdog ends the process with ``os._exit(status)`` one grace later.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence

__all__ = ["bound_the_exit", "detach_from_exit_join"]


def detach_from_exit_join(thread: threading.Thread) -> bool:
    """Take ``thread`` out of the join ``threading._shutdown`` does at exit; True on success."""
    locks = getattr(threading, "_shutdown_locks", None)
    guard = getattr(threading, "_shutdown_locks_lock", None)
    lock = getattr(thread, "_tstate_lock", None)
    if locks is not None and guard is not None and lock is not None:
        with guard:
            locks.discard(lock)
        return True
    if locks is None and callable(getattr(threading, "_thread_shutdown", None)):
        _skip_in_thread_shutdown(thread)  # Python 3.13 and later
        return True
    return False


#: Python 3.13+: the threads the exit's join skips (None until one is detached).
_skipped: weakref.WeakSet[threading.Thread] | None = None


def _skip_in_thread_shutdown(thread: threading.Thread) -> None:
    global _skipped
    if _skipped is None:
        _skipped = weakref.WeakSet()
        threading._thread_shutdown = _join_all_but_skipped  # type: ignore[attr-defined]
    _skipped.add(thread)


def _join_all_but_skipped() -> None:
    """``_thread._shutdown()`` without the detached threads (again while joining started more)."""
    skipped = _skipped if _skipped is not None else ()
    exempt = {threading.main_thread(), threading.current_thread()}
    while True:
        pending = [
            t
            for t in threading.enumerate()
            if t not in exempt and not t.daemon and t not in skipped and t.is_alive()
        ]
        if not pending:
            return
        for thread in pending:
            thread.join()


def bound_the_exit(threads: Sequence[threading.Thread], grace: float, status: int) -> list[str]:
    """Wait up to ``grace`` seconds for ``threads``, then detach those still alive from the
    exit's join; returns their names."""
    deadline = time.monotonic() + max(grace, 0.0)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    stuck = [t for t in alive if not detach_from_exit_join(t)]
    if stuck:
        _start_last_resort_watchdog(max(grace, 1.0), status)
    return [t.name for t in alive]


def _start_last_resort_watchdog(delay: float, status: int) -> None:
    def watchdog() -> None:
        time.sleep(delay)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(status)

    threading.Thread(target=watchdog, name="pytest-shutdown-exit-bound", daemon=True).start()
