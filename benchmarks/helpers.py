"""Cost of each assertion helper on a clean object, and of diagnosing a leak in a large heap.

Run: ``.venv/bin/python benchmarks/helpers.py [--repeat 9] [--json PATH]``. Prints figures
(medians; the machine is shared); it is not a test.

The clean object is the bundled ``ReferenceRenderer``. The diagnosis figure is the time
``assert_finalizes_on_gc`` takes to explain a renderer-like object kept alive by a finalizer
bound to it, in a heap of about 165,000 live objects (torch imported, topped up with plain
objects): the target is under one second.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from figures import Figure, write_json

HEAP_TARGET = 165_000
#: Targets of issue 8, in milliseconds, by label.
TARGETS_MS = {
    "assert_idempotent_shutdown": 5.0,
    "assert_nonblocking_shutdown": 5.0,
    "assert_finalizes_on_gc": 100.0,
    "diagnose finalizer-bound-method (incl. 50 ms wait)": 1000.0,
    "diagnose not-collected (incl. 50 ms wait)": 1000.0,
}


def _timed(label: str, run: Callable[[], Any], repeat: int, out: list[Figure]) -> float:
    """Run ``run`` ``repeat`` times; print and record the median (and the best)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    best = min(times) * 1000
    print(f"{label:<52} {median * 1000:9.2f} ms  (median of {repeat}, best {best:.2f})")
    out.append(Figure(label, median * 1000, "ms", limit=TARGETS_MS.get(label)))
    return median


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


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs per figure (9)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    result = measure(args.repeat)
    if args.json:
        write_json(args.json, result)
    return result


def measure(repeat: int) -> list[Figure]:
    """Every helper on a clean renderer (torch loaded), then leak diagnosis in a large heap."""
    out: list[Figure] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

    from pytest_shutdown import (
        ShutdownContractError,
        assert_finalizes_on_gc,
        assert_idempotent_shutdown,
        assert_nonblocking_shutdown,
        assert_timeout_decoupling,
    )
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.engine.timeouts import get_engine_process_shutdown_timeout
    from pytest_shutdown.helpers.finalization import check_finalizers

    print("clean object: ReferenceRenderer (torch loaded)")
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("ReferenceRenderer() + shutdown() (baseline)", lambda: ReferenceRenderer().shutdown()),
        ("check_finalizers", lambda: check_finalizers(ReferenceRenderer())),
        ("assert_idempotent_shutdown", lambda: assert_idempotent_shutdown(ReferenceRenderer())),
        (
            "assert_idempotent_shutdown(threads=4)",
            lambda: assert_idempotent_shutdown(ReferenceRenderer(), threads=4),
        ),
        ("assert_finalizes_on_gc", lambda: assert_finalizes_on_gc(ReferenceRenderer)),
        (
            "assert_nonblocking_shutdown",
            lambda: assert_nonblocking_shutdown(ReferenceRenderer()),
        ),
        (
            "assert_timeout_decoupling",
            lambda: assert_timeout_decoupling(
                lambda r, p, plat: get_engine_process_shutdown_timeout(r, p, plat), grace=15.0
            ),
        ),
    ]
    for label, run in cases:
        _timed(label, run, repeat, out)

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
        _timed(f"diagnose {code} (incl. 50 ms wait)", leak(factory, code), 3, out)
    return out


if __name__ == "__main__":
    main()
