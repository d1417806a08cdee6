"""CPython 3.11's stuck async-exception flag, and the exception a teardown budget delivers
(:mod:`pytest_shutdown.plugin.budget` re-exports every name)."""

from __future__ import annotations

import sys
import threading

__all__ = [
    "STALE_ASYNC_EXC_LOOPS",
    "ShutdownBudgetExceeded",
    "discard_pending_async_exc",
    "reset_async_exc_flag",
]

#: CPython 3.11's interpreter-wide "async exception pending" flag is set by any
#: ``PyThreadState_SetAsyncExc`` call (a NULL one too) and reset only by a delivery. While it is
#: stuck, a thread with a profile or trace hook spins forever at its next Python call, holding
#: the GIL; so does a Python SIGALRM handler. 3.10, 3.12 and later do not loop.
STALE_ASYNC_EXC_LOOPS = sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11)


class _AsyncExcFlush(Exception):
    """Delivered to the current thread only to reset a stuck async-exception flag."""


def _spin(rounds: int = 64) -> None:
    """A few backward jumps: eval-breaker checks where a pending async exception is raised."""
    for _ in range(rounds):
        pass


def discard_pending_async_exc(ident: int, exc_type: type[BaseException]) -> None:
    """Drop an ``exc_type`` injected into thread ``ident`` and not yet raised; no stuck flag
    (on the current thread it is let out and caught first)."""
    if ident == threading.get_ident():
        try:
            _spin()
        except exc_type:
            pass
    import ctypes  # noqa: PLC0415 - only a fired thread budget needs it

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
    reset_async_exc_flag()


def reset_async_exc_flag() -> None:
    """Reset CPython 3.11's async-exception flag if left stuck (no-op elsewhere), in the thread
    about to install a profile or trace hook: a private exception is delivered here and caught
    (retried when another thread's delivery reset the flag first)."""
    if not STALE_ASYNC_EXC_LOOPS:
        return
    import ctypes  # noqa: PLC0415 - only 3.11 needs it

    ident = ctypes.c_ulong(threading.get_ident())
    _spin()
    for _attempt in range(100):
        try:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(_AsyncExcFlush))
            _spin()
        except _AsyncExcFlush:
            return
    # Never delivered: take it back rather than let it surface later in unrelated code.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, None)


class ShutdownBudgetExceeded(Exception):
    """Raised in the thread running a teardown that exceeded its shutdown budget."""
