"""The signal watch of the guard's session (:mod:`pytest_shutdown.interrupts`)."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from pytest_shutdown.interrupts import _SignalWatch

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="POSIX signals only")


def test_the_watcher_has_ended_when_stop_returns() -> None:
    # A watcher still ending after stop() would race the session's last collections for the
    # GIL; stop() waits for it instead (bounded).
    aborted: list[int] = []
    before = set(sys._current_frames())
    watch = _SignalWatch([signal.SIGUSR2], aborted.append)
    (ident,) = set(sys._current_frames()) - before
    start = time.monotonic()
    watch.stop()
    assert time.monotonic() - start < 2.0
    assert ident not in sys._current_frames()
    assert aborted == []


def test_stop_twice_is_harmless() -> None:
    watch = _SignalWatch([signal.SIGUSR2], lambda status: None)
    watch.stop()
    start = time.monotonic()
    watch.stop()  # nothing left to wait for: returns at once
    assert time.monotonic() - start < 0.5
