"""The plugin's own threads: started with ``_thread`` (out of ``threading.enumerate()``) and
already running when the start returns: on CPython 3.11 a new thread carries its *creator's*
ident until it runs, so a ``PyThreadState_SetAsyncExc`` aimed at the creator in that window
lands in the new thread (it killed the budget's watchdog).
"""

from __future__ import annotations

from _thread import allocate_lock, get_native_id, start_new_thread
from collections.abc import Callable
from typing import Any

__all__ = ["NATIVE_IDS", "START_TIMEOUT_S", "start_own_thread"]

START_TIMEOUT_S = 5.0
#: The kernel tids of the running threads started here: ``threading`` does not list them, and
#: they are never a test's native threads.
NATIVE_IDS: set[int] = set()


def start_own_thread(target: Callable[..., Any], args: tuple[Any, ...] = ()) -> int:
    """Start ``target(*args)`` in a new ``_thread`` thread; return its ident once it runs."""
    running = allocate_lock()
    running.acquire()

    def bootstrap() -> None:
        tid = get_native_id()
        NATIVE_IDS.add(tid)
        running.release()  # the thread's state has its own ident from here on
        try:
            target(*args)
        finally:
            NATIVE_IDS.discard(tid)

    ident = start_new_thread(bootstrap, ())
    running.acquire(timeout=START_TIMEOUT_S)
    return ident
