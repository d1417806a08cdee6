"""The exit never hangs on a test's thread (fail mode).

A non-daemon thread a test leaked is joined by ``threading._shutdown`` when the interpreter
exits: forever, if it never ends (a CI job that never finishes). After the session's report and
record log are written, :func:`bound_the_exit` gives such threads the grace to end, then takes
those still running out of the interpreter's final join (removing their lock from
``threading._shutdown_locks``), so the exit goes on as usual: atexit callbacks, coverage data
and other plugins' exit work all run. Only where that is impossible (an interpreter without
``_shutdown_locks``) a daemon watchdog ends the process with ``os._exit(status)`` one grace
later, after flushing the standard streams: the last resort.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["bound_the_exit", "detach_from_exit_join"]


def detach_from_exit_join(thread: threading.Thread) -> bool:
    """Take ``thread`` out of the join ``threading._shutdown`` does at exit; True on success."""
    locks = getattr(threading, "_shutdown_locks", None)
    guard = getattr(threading, "_shutdown_locks_lock", None)
    lock = getattr(thread, "_tstate_lock", None)
    if locks is None or guard is None or lock is None:
        return False
    with guard:
        locks.discard(lock)
    return True


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
