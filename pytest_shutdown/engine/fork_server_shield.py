"""Imported by the engine's fork server right after the main script, before torch: from then
on the server ignores (and blocks) SIGTERM, and each of its forks restores both at once.

Importing torch takes the server a second or more; shielded only after it, a SIGTERM to the
parent's process group in that second killed the server (:mod:`pytest_shutdown.engine.start`
says why the server must live). Imports nothing but the standard library.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["imported_by_fork_server"]


def imported_by_fork_server() -> bool:
    """Whether multiprocessing's fork server is importing the caller now (its preload)."""
    try:
        from multiprocessing import forkserver  # noqa: PLC0415
    except ImportError:  # pragma: no cover - platforms without fork server
        return False
    server_main = getattr(getattr(forkserver, "main", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is server_main:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _shield_fork_server_from_sigterm() -> None:
    """Ignore and block SIGTERM in the fork server; each of its forks restores both at once.

    The fork server is in its parent's process group, and a DP supervisor stops a child by
    signalling that group: killed by that SIGTERM, the server takes the exit statuses it has not
    reported yet with it, and ``Popen.poll`` answers 255 for an EngineCore still shutting down
    (its parent then neither waits for it nor kills it). CPython shields its own helpers the
    same way: the fork server from SIGINT, the resource tracker from SIGINT and SIGTERM.
    Ignored, for any thread an import started; blocked too, so that a SIGTERM sent to a fork
    before it restored the handler stays pending and ends it then. Only the server's own forks
    restore: their forks keep whatever handler they inherit.
    """
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - POSIX has it
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    shielded = True

    def unshield_this_fork() -> None:
        nonlocal shielded
        if shielded:
            shielded = False
            signal.signal(signal.SIGTERM, previous)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    os.register_at_fork(after_in_child=unshield_this_fork)


if imported_by_fork_server():
    _shield_fork_server_from_sigterm()
