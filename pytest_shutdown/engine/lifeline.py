"""A child process's lifeline to its parent: it exits by itself when the parent dies.

Two mechanisms, because neither is enough alone:

* ``set_parent_death_signal`` asks the Linux kernel (``prctl(PR_SET_PDEATHSIG)``) to send a
  signal when the *thread* that forked this process exits. That is only the logical parent when
  the forking thread lives as long as the parent process: the fork server's main thread, or the
  main thread of a spawn/fork parent. The caller decides (see ``start.pdeathsig_safe``).
* ``ParentWatch`` polls the logical parent by pid (and creation time, so a reused pid is not
  mistaken for it; a zombie counts as dead) and, when it is gone, calls ``on_parent_gone`` and
  then ends the process with ``os._exit`` if it has not exited by itself within ``exit_after_s``.
  This works under every start method, including the fork server, whose children are not the
  children of the process that asked for them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import psutil

from pytest_shutdown._os.prctl import PR_SET_NAME, PR_SET_PDEATHSIG, prctl

logger = logging.getLogger("pytest_shutdown.engine")

#: Exit code of a child that ended because its parent was gone.
EXIT_PARENT_GONE = 3


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its forking thread exits.

    Linux only; returns False (and does nothing) elsewhere or when ``prctl`` is unavailable.
    """
    return prctl(PR_SET_PDEATHSIG, int(signum))


def set_process_name(name: str) -> bool:
    """Set this process's kernel name (``/proc/PID/comm``, 15 bytes), as ``ps`` and psutil show it.

    Tools outside Python (and the tree-death helper's level patterns) tell the levels of an
    engine apart by it: ``EngineCore_DP0``, ``Worker_TP1``. Linux only; False elsewhere.
    """
    return prctl(PR_SET_NAME, name.encode()[:15])


def process_is_alive(proc: psutil.Process) -> bool:
    """True while ``proc`` (the very process, not a reuse of its pid) runs and is not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ParentWatch:
    """A daemon thread that notices the death of ``parent_pid`` and makes this process exit."""

    def __init__(
        self,
        parent_pid: int,
        on_parent_gone: Callable[[], None],
        *,
        exit_after_s: float = 1.0,
        exit_code: int = EXIT_PARENT_GONE,
        poll_s: float = 0.1,
    ) -> None:
        self.parent_pid = parent_pid
        self.exit_after_s = exit_after_s
        self.exit_code = exit_code
        self.poll_s = poll_s
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
        """Stop watching (the process is exiting on its own)."""
        self._stopped.set()

    def _run(self) -> None:
        while self._parent is not None and process_is_alive(self._parent):
            if self._stopped.wait(self.poll_s):
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
            os._exit(self.exit_code)
