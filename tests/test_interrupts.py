"""The signal watch of the guard's session (:mod:`pytest_shutdown.plugin.interrupts`)."""

from __future__ import annotations

import faulthandler
import signal
import sys
import time

import pytest

from pytest_shutdown.plugin.interrupts import _SignalWatch

# The guard starts the watch only where faulthandler.register exists (POSIX), as here.
pytestmark = pytest.mark.skipif(
    not hasattr(faulthandler, "register") or not hasattr(signal, "SIGUSR2"),
    reason="the signal watch needs faulthandler.register and SIGUSR2 (POSIX only)",
)


def test_the_watcher_has_ended_when_stop_returns() -> None:
    # A watcher still ending after stop() would race the session's last collections for the
    # GIL; stop() waits for it instead (bounded).
    aborted: list[int] = []
    watch = _SignalWatch([signal.SIGUSR2], aborted.append)
    ident = watch._ident
    assert ident in sys._current_frames()  # the watcher runs
    start = time.monotonic()
    watch.stop()
    assert time.monotonic() - start < 2.0
    assert ident not in sys._current_frames()
    assert aborted == []


def test_a_watch_whose_thread_cannot_start_leaves_nothing_to_wait_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object) -> int:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr("pytest_shutdown.plugin.interrupts.start_own_thread", refuse)
    with pytest.raises(RuntimeError):
        _SignalWatch([signal.SIGUSR2], lambda status: None)
    still_registered = faulthandler.unregister(signal.SIGUSR2)  # type: ignore[func-returns-value]
    assert not still_registered  # its C-level handler went with it


def test_stop_twice_is_harmless() -> None:
    watch = _SignalWatch([signal.SIGUSR2], lambda status: None)
    watch.stop()
    start = time.monotonic()
    watch.stop()  # nothing left to wait for: returns at once
    assert time.monotonic() - start < 0.5
