"""Small renderer-like classes for the helper tests: the correct renderer pattern, and
each bug of examples/regressions/.

Each class owns real resources (thread pools, a cache with ``close()``) and a real shutdown path.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

logger = logging.getLogger("tests.shutdown_subjects")


class Cache:
    """A cache whose ``close()`` counts its calls; ``strict`` caches refuse a second close."""

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.close_calls = 0

    def close(self) -> None:
        if self.strict and self.close_calls:
            raise RuntimeError("cache already closed")
        self.close_calls += 1


class GoodRenderer:
    """The correct pattern: one ExitStack, ``finalize(self, self._resources.close)``,
    ``wait=False`` pools."""

    def __init__(self) -> None:
        self._resources = ExitStack()
        self._resources.callback(logger.debug, "[shutdown] GoodRenderer")
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="good-tok")
        self._resources.callback(self._executor.shutdown, wait=False)
        self._mm_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="good-mm")
        self._resources.callback(self._mm_executor.shutdown, wait=False)
        cache = Cache(strict=True)
        self._resources.callback(cache.close)
        self.mm_cache = cache

    def shutdown(self) -> None:
        self._resources.close()


class BoundMethodFinalizer(GoodRenderer):
    """Review bug 1: ``weakref.finalize(self, self.shutdown)`` keeps the renderer alive."""

    def __init__(self) -> None:
        super().__init__()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self.shutdown)


def _shutdown_renderer(renderer: GoodRenderer) -> None:
    renderer._resources.close()


class SelfInArgsFinalizer(GoodRenderer):
    """Review bug 2: ``weakref.finalize(self, _shutdown_renderer, self)``: self in the args."""

    def __init__(self) -> None:
        super().__init__()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown_renderer, self)


class DeepHoldFinalizer(GoodRenderer):
    """The object hidden in a partial, inside a list, inside a dict, inside a closure."""

    def __init__(self) -> None:
        super().__init__()
        self._finalizer.detach()
        holder = {"renderers": [self]}

        def close_all() -> None:
            for renderer in holder["renderers"]:
                renderer._resources.close()

        self._finalizer = weakref.finalize(self, functools.partial(_call, close_all))


def _call(func: object) -> None:
    func()  # type: ignore[operator]


class EnterContextExecutor:
    """Review bug 3: ``enter_context(executor)`` closes with ``shutdown(wait=True)``: blocks."""

    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="enter-ctx")
        self._resources.enter_context(self._executor)

    def shutdown(self) -> None:
        self._resources.close()


class ExecutorAndCache:
    """A pool and a cache: ``shutdown`` stops the pool without waiting and closes the cache, on
    every call (nothing remembers an earlier one)."""

    workers = 1
    prefix = "pool"
    strict = False

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix=self.prefix
        )
        self.mm_cache = Cache(strict=self.strict)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)
        self.mm_cache.close()


class RepeatsCleanup(ExecutorAndCache):
    """Review bug 4: the pre-ExitStack shutdown closes the cache again on every call."""

    workers, prefix = 2, "repeats"


class RaisesSecondTime(ExecutorAndCache):
    """Review bug 5: the second shutdown closes a strict cache twice and raises."""

    prefix, strict = "raises", True


class RacyShutdown:
    """Idempotent when called in turn, not when raced: check-then-act on a flag."""

    def __init__(self) -> None:
        self.mm_cache = Cache()
        self._closed = False

    def shutdown(self) -> None:
        if not self._closed:
            time.sleep(0.05)  # a window for the other racers
            self.mm_cache.close()
            self._closed = True


class FinalizerRepeatsCleanup:
    """Idempotent shutdown, but its finalizer is never detached: GC closes the cache again."""

    def __init__(self) -> None:
        self.mm_cache = Cache()
        self._closed = False
        self._finalizer = weakref.finalize(self, self.mm_cache.close)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.mm_cache.close()


class NoGcFallback(ExecutorAndCache):
    """Explicit shutdown releases everything; dropping it releases nothing (cleanup-missing)."""

    prefix = "no-gc"


class ForgetsExecutor(ExecutorAndCache):
    """Shutdown closes the cache but leaves its pool running: its threads never end."""

    prefix = "forgotten"

    def shutdown(self) -> None:
        self.mm_cache.close()


class LockedShutdown(GoodRenderer):
    """The correct pattern with racing callers serialised, as the bundled renderer does."""

    def __init__(self) -> None:
        super().__init__()
        self._shutdown_lock = threading.Lock()

    def shutdown(self) -> None:
        with self._shutdown_lock:
            self._resources.close()
