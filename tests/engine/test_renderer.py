"""ReferenceRenderer shutdown is idempotent, non-blocking; the GC path runs it once."""

from __future__ import annotations

import gc
import gc as _gc
import logging
import threading
import time
import weakref
from concurrent.futures import wait

import pytest
import torch

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.renderer import MMProcessorCache, ReferenceRenderer


def _renderer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("renderer-")]


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_tokenize_roundtrip_and_image_preprocessing_through_the_cache() -> None:
    renderer = ReferenceRenderer()
    try:
        ids = renderer.tokenize("héllo wörld").result(timeout=5)
        assert renderer.detokenize(ids).result(timeout=5) == "héllo wörld"
        image = torch.randint(0, 255, (3, 40, 30), dtype=torch.uint8)
        first = renderer.preprocess_image(image).result(timeout=5)
        second = renderer.preprocess_image(image.clone()).result(timeout=5)
        assert first.shape == (3, 16, 16)
        assert torch.equal(first, second)
        assert (renderer.mm_cache.misses, renderer.mm_cache.hits) == (1, 1)
    finally:
        renderer.shutdown()


def test_asyncio_wrappers() -> None:
    import asyncio

    renderer = ReferenceRenderer()
    try:
        ids = asyncio.run(renderer.tokenize_async("abc"))
        assert ids == [97, 98, 99]
        assert asyncio.run(renderer.detokenize_async(ids)) == "abc"
    finally:
        renderer.shutdown()


def test_shutdown_twice_closes_the_cache_once_and_logs_once(caplog) -> None:
    renderer = ReferenceRenderer()
    caplog.set_level(logging.INFO, logger="pytest_shutdown.engine")
    renderer.shutdown()
    renderer.shutdown()
    assert renderer.mm_cache.close_calls == 1
    assert renderer.is_shut_down
    assert [r.getMessage() for r in caplog.records].count("[shutdown] ReferenceRenderer") == 1
    with pytest.raises(RuntimeError):
        renderer.tokenize("too late")


def test_shutdown_from_four_threads_at_once_runs_cleanups_once() -> None:
    renderer = ReferenceRenderer()
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def race() -> None:
        try:
            barrier.wait(timeout=5)
            renderer.shutdown()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert not errors
    assert renderer.mm_cache.close_calls == 1


def test_dropped_renderer_is_collected_and_runs_cleanups_once() -> None:
    renderer = ReferenceRenderer()
    cache = renderer.mm_cache
    renderer.tokenize("warm the pool up").result(timeout=5)
    ref = weakref.ref(renderer)
    del renderer
    gc.collect()
    assert ref() is None, "the renderer was kept alive (its finalizer must not hold it)"
    assert cache.close_calls == 1
    assert _wait_for(lambda: not any(t.is_alive() for t in _renderer_threads()))


def test_explicit_shutdown_then_gc_does_not_repeat_cleanups() -> None:
    renderer = ReferenceRenderer()
    cache = renderer.mm_cache
    renderer.shutdown()
    ref = weakref.ref(renderer)
    del renderer
    gc.collect()
    assert ref() is None
    assert cache.close_calls == 1


def test_the_finalizer_holds_no_reference_to_the_renderer() -> None:
    renderer = ReferenceRenderer()
    try:
        func, args, kwargs = renderer._finalizer.peek()[1:]  # type: ignore[index]
        assert getattr(func, "__self__", None) is not renderer
        assert func.__self__ is renderer._resources  # type: ignore[attr-defined]
        assert renderer not in args and renderer not in kwargs.values()
        referrers = _gc.get_referrers(renderer)
        assert not any(isinstance(r, weakref.finalize) for r in referrers)
    finally:
        renderer.shutdown()


def test_shutdown_while_tasks_run_returns_at_once() -> None:
    renderer = ReferenceRenderer(EngineConfig(renderer_num_workers=2))
    release = threading.Event()
    busy = [renderer._executor.submit(release.wait, 10) for _ in range(2)]
    busy.append(renderer._mm_executor.submit(release.wait, 10))
    try:
        started = time.monotonic()
        renderer.shutdown()
        elapsed = time.monotonic() - started
        assert elapsed < 2.0, f"shutdown blocked for {elapsed:.2f}s on running tasks"
        assert not any(f.done() for f in busy)
    finally:
        release.set()
    done, not_done = wait(busy, timeout=5)
    assert not not_done
    assert _wait_for(lambda: not any(t.is_alive() for t in _renderer_threads()))


def test_cache_is_not_looked_up_on_self_at_registration() -> None:
    # The callback must close the cache that existed at registration, even if the attribute
    # is later replaced (a reviewed version's AttributeError bug looked the attribute up too early).
    renderer = ReferenceRenderer()
    original = renderer.mm_cache
    renderer.mm_cache = MMProcessorCache(4)
    renderer.shutdown()
    assert original.close_calls == 1
    assert renderer.mm_cache.close_calls == 0
