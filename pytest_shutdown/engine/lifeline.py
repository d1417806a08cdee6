"""A child process's lifeline to its parent: it exits by itself when the parent dies.

Two mechanisms, neither enough alone: ``set_parent_death_signal`` (``PR_SET_PDEATHSIG``) fires
when the *thread* that forked this process exits, which is the parent's death only when that
thread lives as long as the parent (see ``start.pdeathsig_safe``); ``ParentWatch`` polls the
logical parent by pid (and creation time; a zombie counts as dead), which works under every
start method, the fork server included.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import psutil

from pytest_shutdown._os.prctl import PR_SET_NAME, PR_SET_PDEATHSIG, prctl

logger = logging.getLogger("pytest_shutdown.engine")

#: Exit code of a child that ended because its parent was gone.
EXIT_PARENT_GONE = 3


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the forking thread exits (Linux; else False)."""
    return prctl(PR_SET_PDEATHSIG, int(signum))


def set_process_name(name: str) -> bool:
    """Set ``/proc/PID/comm`` (15 bytes), by which the tree-death helper's level patterns tell
    the levels apart (Linux; else False)."""
    return prctl(PR_SET_NAME, name.encode()[:15])


def on_stop_signals(handler: Callable[[int, Any], Any] | int) -> dict[int, Any]:
    """Install ``handler`` for SIGTERM and SIGINT; returns the handlers it replaced."""
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}


def wake_fd(fd: int, data: bytes = b"\x01") -> None:
    """Write to a non-blocking wake-up pipe; a full one has a wake-up pending already."""
    try:
        os.write(fd, data)
    except OSError:
        pass


def process_is_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ParentWatch:
    """A daemon thread that notices the death of ``parent_pid``, calls ``on_parent_gone``, and
    ends this process with ``os._exit(EXIT_PARENT_GONE)`` unless it exited by itself within
    ``exit_after_s``."""

    POLL_S = 0.1

    def __init__(
        self, parent_pid: int, on_parent_gone: Callable[[], None], *, exit_after_s: float = 1.0
    ) -> None:
        self.parent_pid = parent_pid
        self.exit_after_s = exit_after_s
        self.parent_gone = threading.Event()
        self._on_parent_gone = on_parent_gone
        self._stopped = threading.Event()
        try:
            self._parent: psutil.Process | None = psutil.Process(parent_pid)
        except psutil.Error:
            self._parent = None
        self._thread = threading.Thread(
            target=self._run, name=f"parent-watch-{parent_pid}", daemon=True
        )

    def start(self) -> ParentWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while self._parent is not None and process_is_alive(self._parent):
            if self._stopped.wait(self.POLL_S):
                return
        if self._stopped.is_set():
            return
        self.parent_gone.set()
        logger.warning("[shutdown] parent pid=%d is gone; exiting", self.parent_pid)
        try:
            self._on_parent_gone()
        except Exception:  # noqa: BLE001 - the backstop below must still run
            logger.exception("on_parent_gone failed")
        if not self._stopped.wait(self.exit_after_s):
            os._exit(EXIT_PARENT_GONE)
