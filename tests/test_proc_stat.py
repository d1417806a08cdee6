"""Whether a process is on its way out (``pytest_shutdown._os.proc_stat.process_ending``), on
real processes: the collateral-kill check leaves out what was dying before its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pytest_shutdown._os.proc_stat import process_ending, process_running

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/PID/stat (Linux)"
)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"])


def test_a_running_process_is_not_ending() -> None:
    child = _sleeper()
    try:
        assert not process_ending(child.pid)
        assert not process_ending(os.getpid())
    finally:
        child.kill()
        child.wait(10)


def test_a_process_sent_sigkill_is_ending_at_once_and_until_reaped() -> None:
    """The kernel marks a fatal signal pending in the sender's ``kill()``: ending before the
    process ran again, then exiting, then a zombie; gone once reaped."""
    child = _sleeper()
    os.kill(child.pid, signal.SIGKILL)
    assert process_ending(child.pid)
    deadline = time.monotonic() + 10
    while process_running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_ending(child.pid)  # the zombie
    child.wait(10)
    assert process_ending(child.pid)  # reaped: gone


def test_a_caught_sigterm_does_not_make_a_process_ending() -> None:
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: None); "
        "print('ready', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        child.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        assert not process_ending(child.pid)
    finally:
        child.kill()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
