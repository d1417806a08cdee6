"""Cost of each assertion helper on a clean object, and of diagnosing a leak in a large heap.

Run: ``.venv/bin/python benchmarks/helpers.py``. Prints figures; it is not a test.

The clean object is the bundled ``ReferenceRenderer``. The diagnosis figure is the time
``assert_finalizes_on_gc`` takes to explain a renderer-like object kept alive by a finalizer
bound to it, in a heap of about 165,000 live objects (torch imported, topped up with plain
objects): the target is under one second.
"""

from __future__ import annotations

import gc
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

HEAP_TARGET = 165_000


def _timed(label: str, run: Callable[[], Any], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    print(f"{label:<48} {best * 1000:9.2f} ms  (best of {repeat})")
    return best


class _Leaky:
    """Kept alive forever by its own finalizer: ``weakref.finalize(self, self.shutdown)``."""

    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self.shutdown)

    def shutdown(self) -> None:
        self._resources.close()


class _Cycle:
    """Kept alive by a module-level list: a plain not-collected object."""

    def shutdown(self) -> None:
        pass


_HELD: list[object] = []


def _held() -> _Cycle:
    obj = _Cycle()
    _HELD.append(obj)
    return obj


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

    from pytest_shutdown import (
        ShutdownContractError,
        assert_finalizes_on_gc,
        assert_idempotent_shutdown,
        assert_nonblocking_shutdown,
        assert_timeout_decoupling,
        check_finalizers,
    )
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.engine.timeouts import get_engine_process_shutdown_timeout

    print("clean object: ReferenceRenderer")
    _timed("ReferenceRenderer() + shutdown() (baseline)", lambda: ReferenceRenderer().shutdown())
    _timed("check_finalizers", lambda: check_finalizers(ReferenceRenderer()))
    _timed("assert_idempotent_shutdown", lambda: assert_idempotent_shutdown(ReferenceRenderer()))
    _timed(
        "assert_idempotent_shutdown(threads=4)",
        lambda: assert_idempotent_shutdown(ReferenceRenderer(), threads=4),
    )
    _timed("assert_finalizes_on_gc", lambda: assert_finalizes_on_gc(ReferenceRenderer))
    _timed("assert_nonblocking_shutdown", lambda: assert_nonblocking_shutdown(ReferenceRenderer()))
    _timed(
        "assert_timeout_decoupling",
        lambda: assert_timeout_decoupling(
            lambda r, p, plat: get_engine_process_shutdown_timeout(r, p, plat), grace=15.0
        ),
    )

    padding = [object() for _ in range(max(0, HEAP_TARGET - len(gc.get_objects())))]
    heap = len(gc.get_objects())
    print(f"\nheap: {heap} gc-tracked objects ({len(padding)} added)")

    def leak(factory: Callable[[], object], code: str) -> Callable[[], None]:
        def run() -> None:
            try:
                assert_finalizes_on_gc(factory, timeout=0.05)
            except ShutdownContractError as exc:
                assert exc.codes[0] == code, exc.codes
            else:
                raise AssertionError("the leak was not detected")

        return run

    for factory, code in ((_Leaky, "finalizer-bound-method"), (_held, "not-collected")):
        cost = _timed(f"diagnose {code} (incl. 50 ms wait)", leak(factory, code), repeat=3)
        print(f"{'':<48} {'OK' if cost < 1.0 else 'OVER'} target 1 s")


if __name__ == "__main__":
    main()
