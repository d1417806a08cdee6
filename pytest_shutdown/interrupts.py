"""SIGTERM ends a guarded session in order, as Ctrl-C does: teardown, summary, report.

pytest has no SIGTERM handler, so a CI runner's SIGTERM kills the process where it stands: no
fixture teardown, no summary, no report. While a guarded session (or one writing
``--shutdown-report``) runs, the first SIGTERM raises :class:`KeyboardInterrupt` in the main
thread instead; a second one gets the default action (like a second Ctrl-C, it ends the
process at once; the record log keeps every finished test).

Nothing is installed when a handler other than the default one is already in place (the user's
code installed its own), on an xdist worker (the controller ends the workers), or outside the
main thread. A handler the user's code installs during the run is left alone. A forked child
never keeps the handler (:mod:`pytest_shutdown.forks`): ``Process.terminate()`` and
``Pool.terminate()`` kill it with SIGTERM as they would without the plugin.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import pytest

from pytest_shutdown.forks import forget_in_child, undo_in_forked_child


class SigtermInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt that SIGTERM raises under the shutdown plugin."""


class SigtermEndsSessionInOrder:
    """A pytest plugin object: installs the SIGTERM handler for the session's duration."""

    def __init__(self) -> None:
        self._installed = False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process
        raise SigtermInterrupted("SIGTERM: the session ends in order (teardown, summary, report)")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone else's handler: theirs governs
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        undo_in_forked_child(
            "sigterm", self._restore_default_in_child, hold=(signal.SIGTERM,)
        )

    def _restore_default_in_child(self) -> None:
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if not self._installed:
            return
        self._installed = False
        forget_in_child("sigterm")
        current: Any = signal.getsignal(signal.SIGTERM)
        if current == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
