"""The plugin's own threads: started with ``_thread`` and already running when the start returns.

``_thread.start_new_thread`` keeps them out of a patched ``threading.Thread.start`` and out of
``threading.enumerate()``. Unlike ``Thread.start`` it returns before the thread runs, and on
CPython 3.11 a new thread's state carries its *creator's* ident until then: a
``PyThreadState_SetAsyncExc(creator_ident, ...)`` in that window lands in the new thread, not in
the creator. The budget's reset of the async-exception flag did exactly that right after starting
its watchdog: the watchdog died of the exception, or the interpreter's flag stuck and the
teardown's SIGALRM handler spun at its first line until the second budget ended the process
(exit code 70). ``start_own_thread`` waits until the thread runs, so no such window is left.
"""

from __future__ import annotations

from _thread import allocate_lock, start_new_thread
from collections.abc import Callable
from typing import Any

__all__ = ["START_TIMEOUT_S", "start_own_thread"]

#: The bound on waiting for a new thread to run (it takes microseconds; this is no cost).
START_TIMEOUT_S = 5.0


def start_own_thread(target: Callable[..., Any], args: tuple[Any, ...] = ()) -> int:
    """Start ``target(*args)`` in a new ``_thread`` thread; return its ident once it runs."""
    running = allocate_lock()
    running.acquire()

    def bootstrap() -> None:
        running.release()  # the thread's state has its own ident from here on
        target(*args)

    ident = start_new_thread(bootstrap, ())
    running.acquire(timeout=START_TIMEOUT_S)
    return ident
