"""SignalStop: a stop request a signal handler sets without taking a lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pytest_shutdown.engine.stop_flag import SignalStop

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: The signal lands while the main thread is inside the stop object's wait, between two steps.
HANDLER_LANDS_INSIDE_WAIT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from pytest_shutdown.engine.stop_flag import SignalStop

    stop = threading.Event() if sys.argv[1] == "event" else SignalStop()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    if sys.argv[1] == "event":
        with stop._cond:  # where Event.wait() is between its lock and its sleep
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(10))  # the handler runs at a bytecode boundary in here
    else:
        os.kill(os.getpid(), signal.SIGTERM)
    print("stopped" if stop.wait(5.0) else "not stopped", flush=True)
    """
)


def run_scenario(kind: str, timeout: float) -> str:
    try:
        result = subprocess.run(
            [sys.executable, "-c", HANDLER_LANDS_INSIDE_WAIT, kind],
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "hung"
    return result.stdout.strip() or result.stderr


def test_an_event_set_by_a_handler_inside_its_own_wait_hangs_the_process() -> None:
    # Why SignalStop exists: the handler waits for the lock its own thread holds.
    assert run_scenario("event", timeout=3.0) == "hung"


def test_a_signal_stop_set_by_a_handler_stops_the_wait() -> None:
    assert run_scenario("signal-stop", timeout=30.0) == "stopped"


def test_a_handler_during_the_wait_ends_it_within_a_slice() -> None:
    stop = SignalStop()
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())
    try:
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        started = time.monotonic()
        assert stop.wait(10.0)
        assert time.monotonic() - started < 2.0
        timer.join(2.0)
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_another_thread_can_set_it() -> None:
    stop = SignalStop()
    threading.Timer(0.05, stop.set).start()
    assert stop.wait(10.0)
    assert stop.is_set()


def test_without_a_request_the_wait_times_out() -> None:
    stop = SignalStop()
    started = time.monotonic()
    assert not stop.wait(0.05)
    assert 0.04 <= time.monotonic() - started < 2.0
    assert not stop.is_set()
    assert not stop.wait(0)


def test_a_storm_of_signals_during_short_waits_never_wedges_it() -> None:
    stop = SignalStop()
    landed: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: landed.append(signum))
    done = threading.Event()

    def storm() -> None:
        while not done.is_set() and len(landed) < 300:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
            time.sleep(0.0005)
        stop.set()

    thread = threading.Thread(target=storm)
    thread.start()
    try:
        deadline = time.monotonic() + 20.0
        while not stop.wait(0.001) and time.monotonic() < deadline:
            pass
        assert stop.is_set()
    finally:
        done.set()
        thread.join(5.0)
        signal.signal(signal.SIGUSR1, old)
    assert landed
