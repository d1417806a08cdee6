"""Discovery and counting of cleanups: captured bound methods, base-class calls, threads, hooks."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import shutdown_subjects as s

from pytest_shutdown.helpers.cleanups import CleanupCounter, discover_cleanups


def test_discovery_finds_attributes_callbacks_and_skips_locks_and_routes() -> None:
    renderer = s.LockedShutdown()
    try:
        labels = [spec.label for spec in discover_cleanups(renderer)]
    finally:
        renderer.shutdown()
    assert "_executor.shutdown" in labels
    assert "_mm_executor.shutdown" in labels
    assert "mm_cache.close" in labels
    assert any(label.startswith("_resources callback 0 (Logger.debug)") for label in labels)
    assert not any("_shutdown_lock" in label or "_finalizer" in label for label in labels)
    assert not any(label.endswith("ExitStack.close") for label in labels)


def test_bound_method_captured_by_an_exit_stack_is_counted_once() -> None:
    class LocalCache:
        def __init__(self) -> None:
            self._resources = ExitStack()
            self._resources.callback(s.Cache().close)  # no attribute leads to this cache

        def shutdown(self) -> None:
            self._resources.close()

    obj = LocalCache()
    counter = CleanupCounter(discover_cleanups(obj))
    with counter.charge("call 1"):
        obj.shutdown()
    assert list(counter.table().values()) == [{"call 1": 1}]


def test_a_cleanup_calling_its_base_class_counts_once() -> None:
    class Pool(ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)

    class Holder:
        def __init__(self) -> None:
            self.pool = Pool(max_workers=1)

        def shutdown(self) -> None:
            self.pool.shutdown(wait=False)

    obj = Holder()
    counter = CleanupCounter(discover_cleanups(obj))
    with counter.charge("call 1"):
        obj.shutdown()
    assert counter.table() == {"pool.shutdown": {"call 1": 1}}


def test_calls_on_threads_the_check_does_not_drive_are_not_charged() -> None:
    cache = s.Cache()

    class Holder:
        def __init__(self) -> None:
            self.cache = cache
            self.pool = ThreadPoolExecutor(max_workers=1)

    obj = Holder()
    counter = CleanupCounter(discover_cleanups(obj))
    try:
        with counter.charge("call 1"):
            obj.pool.submit(cache.close).result(timeout=10)  # a worker closes it: not a repeat
    finally:
        obj.pool.shutdown(wait=True)
    assert cache.close_calls == 1
    assert counter.table()["cache.close"] == {"call 1": 0}


def test_previous_profile_hook_keeps_running_and_is_restored() -> None:
    seen: list[str] = []

    def previous(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is s.Cache.close.__code__:
            seen.append("close")

    obj = s.RepeatsCleanup()
    counter = CleanupCounter(discover_cleanups(obj))
    old = sys.getprofile()
    sys.setprofile(previous)
    try:
        with counter.charge("call 1"):
            obj.shutdown()
        assert sys.getprofile() is previous
    finally:
        sys.setprofile(old)
    assert seen == ["close"]
    assert counter.table()["mm_cache.close"] == {"call 1": 1}


def test_nothing_installed_keeps_the_object_alive() -> None:
    obj = s.GoodRenderer()
    ref = weakref.ref(obj)
    counter = CleanupCounter(discover_cleanups(obj))
    with counter.charge("gc"):
        del obj
        gc.collect()
    assert ref() is None
    assert counter.table()["mm_cache.close"] == {"gc": 1}


def test_racing_rounds_are_charged_per_thread() -> None:
    cache = s.Cache()

    class Holder:
        def __init__(self) -> None:
            self.cache = cache

    counter = CleanupCounter(discover_cleanups(Holder()))
    barrier = threading.Barrier(3)

    def close() -> None:
        barrier.wait(timeout=10)
        with counter.charge("call 1"):
            cache.close()

    threads = [threading.Thread(target=close) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert counter.table()["cache.close"] == {"call 1": 3}


def test_watch_rejects_what_it_cannot_count() -> None:
    with pytest.raises(ValueError, match="watch"):
        discover_cleanups(s.Cache(), watch=[42])


def test_the_previous_profile_hook_is_restored_when_the_block_raises() -> None:
    obj = s.RepeatsCleanup()
    counter = CleanupCounter(discover_cleanups(obj))
    old = sys.getprofile()
    with pytest.raises(RuntimeError, match="boom"):
        with counter.charge("call 1"):
            obj.shutdown()
            raise RuntimeError("boom")
    assert sys.getprofile() is old


STUCK_FLAG = textwrap.dedent(
    """
    import ctypes, sys, threading
    sys.path.insert(0, {here!r})
    import shutdown_subjects as s
    from pytest_shutdown.helpers.cleanups import CleanupCounter, discover_cleanups

    obj = s.RepeatsCleanup()
    counter = CleanupCounter(discover_cleanups(obj))
    # How a watchdog takes back an async exception it injected: on CPython 3.11 this leaves the
    # interpreter's async-exception flag set for good (a fired thread-method TeardownBudget did,
    # and test_graphs.py spun forever after test_plugin_budget.py in the same worker).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
    with counter.charge("call 1"):
        obj.shutdown()  # spun at its first bytecode, GIL held, SIGALRM handler spinning too
    print("counted", counter.table()["mm_cache.close"])
    """
)


def test_a_stuck_async_exception_flag_does_not_make_the_counted_call_spin() -> None:
    script = STUCK_FLAG.format(here=str(Path(__file__).parent))
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the call counted under the profile hook spun forever (stuck async-exc flag)")
    assert done.returncode == 0, done.stderr
    assert "counted {'call 1': 1}" in done.stdout
