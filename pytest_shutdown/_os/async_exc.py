"""CPython 3.11's stuck async-exception flag, and the exception a teardown budget delivers.

Moved from :mod:`pytest_shutdown.budget` (issue 47): the cleanup counter of the helpers resets the
flag too, and the helpers sit below the plugin; :mod:`pytest_shutdown.budget` re-exports every
name.
"""

from __future__ import annotations

import sys
import threading

__all__ = [
    "STALE_ASYNC_EXC_LOOPS",
    "ShutdownBudgetExceeded",
    "discard_pending_async_exc",
    "reset_async_exc_flag",
]

#: CPython 3.11 keeps one interpreter-wide "an async exception is pending" flag. Any
#: ``PyThreadState_SetAsyncExc`` call sets it, also one that *clears* a thread's exception (NULL),
#: and only the delivery of a real async exception resets it. While it is stuck, every eval-breaker
#: check finds nothing to do, and a thread with a profile or trace hook (``sys.setprofile``,
#: coverage, the cleanup counter) spins forever at the entry of the next Python function it calls,
#: holding the GIL; a Python SIGALRM handler (pytest-timeout's) spins the same way when it starts.
#: 3.10, 3.12 and later do not loop.
STALE_ASYNC_EXC_LOOPS = sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11)


class _AsyncExcFlush(Exception):
    """Delivered to the current thread only to reset a stuck async-exception flag."""


def _spin(rounds: int = 64) -> None:
    """A few backward jumps: eval-breaker checks where a pending async exception is raised."""
    for _ in range(rounds):
        pass


def discard_pending_async_exc(ident: int, exc_type: type[BaseException]) -> None:
    """Drop an ``exc_type`` injected into thread ``ident`` and not yet raised; no stuck flag.

    On the current thread the pending exception is let out where it is caught (its delivery
    resets the interpreter's flag). Then the thread's async exception is cleared with
    ``PyThreadState_SetAsyncExc(ident, NULL)``, which on CPython 3.11 leaves the flag set, so
    :func:`reset_async_exc_flag` resets it (see :data:`STALE_ASYNC_EXC_LOOPS`).
    """
    if ident == threading.get_ident():
        try:
            _spin()
        except exc_type:
            pass
    import ctypes  # noqa: PLC0415 - only a fired thread budget needs it

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
    reset_async_exc_flag()


def reset_async_exc_flag() -> None:
    """Reset CPython 3.11's async-exception flag if someone left it stuck (no-op elsewhere).

    Call it in the thread that is about to install a profile or trace hook. An exception already
    pending for this thread is raised here, as it would be at the next check; then a private one
    is delivered to this thread and caught, and its delivery resets the flag. Retried when
    another thread's delivery reset the flag first and left the private one undelivered.
    """
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
    # Never delivered (cannot happen without a pathological race): take it back rather than
    # let it surface later in unrelated code.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, None)


class ShutdownBudgetExceeded(Exception):
    """Raised in the thread running a teardown that exceeded its shutdown budget."""
