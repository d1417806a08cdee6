"""start_own_thread: the plugin's raw threads run before the start returns (CPython 3.11 race)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from pytest_shutdown._os.own_threads import start_own_thread
from pytest_shutdown.plugin.budget import STALE_ASYNC_EXC_LOOPS

#: Starts threads and at once aims an async exception at the starting thread, 100 times; prints
#: how many landed in a new thread instead (each one kills that thread, "ignored in thread").
AIMED_AT_THE_CREATOR = textwrap.dedent(
    """
    import sys, time, _thread
    from pytest_shutdown.plugin.budget import reset_async_exc_flag
    from pytest_shutdown._os.own_threads import start_own_thread

    landed = []
    sys.unraisablehook = lambda unraisable: landed.append(unraisable.exc_type.__name__)

    def worker():
        time.sleep(0.01)

    start = _thread.start_new_thread if sys.argv[1] == "raw" else start_own_thread
    for _ in range(100):
        start(worker, ())
        reset_async_exc_flag()  # PyThreadState_SetAsyncExc(this thread's ident, ...)
    time.sleep(0.5)
    print(len(landed))
    """
)


def landed_in_new_threads(start: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", AIMED_AT_THE_CREATOR, start],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not STALE_ASYNC_EXC_LOOPS, reason="the race is CPython 3.11's")
def test_a_raw_thread_not_yet_running_takes_its_creators_async_exception() -> None:
    # Why start_own_thread exists: the new thread's state still carries the creator's ident.
    assert landed_in_new_threads("raw") > 0


def test_an_own_thread_never_takes_its_creators_async_exception() -> None:
    assert landed_in_new_threads("own") == 0


def test_the_target_runs_with_its_args_in_the_thread_whose_ident_is_returned() -> None:
    seen: list[int] = []
    ran = threading.Event()

    def target(box: list[int]) -> None:
        box.append(threading.get_ident())
        ran.set()

    ident = start_own_thread(target, (seen,))
    assert ran.wait(10.0)
    assert seen == [ident] and ident != threading.get_ident()
