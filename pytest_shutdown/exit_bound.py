"""The exit never hangs on a test's thread (fail mode).

A non-daemon thread a test leaked is joined by ``threading._shutdown`` when the interpreter
exits: forever, if it never ends (a CI job that never finishes). After the session's report and
record log are written, :func:`bound_the_exit` gives such threads the grace to end, then takes
those still running out of the interpreter's final join, so the exit goes on as usual: atexit
callbacks, coverage data and other plugins' exit work all run. Up to Python 3.12 the join waits
on ``threading._shutdown_locks``: the thread's lock is removed from it. From 3.13 it is
``_thread._shutdown()``, which waits on every non-daemon thread's handle and cannot be told to
skip one: ``threading._thread_shutdown`` (the name ``threading._shutdown`` calls) is replaced by
a join of the non-daemon threads ``threading.enumerate()`` lists, less the detached ones (a
non-daemon thread started with ``_thread.start_joinable_thread`` directly, outside
``threading``, is then not waited for). Only where neither is possible a daemon watchdog ends
the process with ``os._exit(status)`` one grace later, after flushing the standard streams: the
last resort.
"""

from __future__ import annotations

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
    """``_thread._shutdown()`` without the detached threads: join every other non-daemon
    thread, again while joining them started more."""
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
    """Wait up to ``grace`` seconds (one deadline) for ``threads``; detach those still alive
    from the exit's join. Returns the names of the threads detached (or left to the watchdog)."""
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
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    threading.Thread(target=watchdog, name="pytest-shutdown-exit-bound", daemon=True).start()
