"""The OS-resource kinds' cost per clean test (issue 20): fds, ports and shm, on a process that
holds 200 file descriptors, and what one leak costs to describe.

    .venv/bin/python benchmarks/os_resources.py [--json]

Per clean test each kind takes one snapshot before and looks for new items after: one ``fstat``
of ``/proc/self/fd`` (fds, ports) and of ``/dev/shm`` (shm), plus the process kind's ``waitid``
for the ports kind. Figures are medians of many rounds, in microseconds. Nothing is asserted;
the budget (issue 26: every kind together <= 0.1 ms per clean test) is printed beside them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from pytest_shutdown.resources.fds import FdKind
from pytest_shutdown.resources.ports import PortKind
from pytest_shutdown.resources.shm import ShmKind

HELD_FDS = 200
ROUNDS = 2000
BUDGET_US = 100.0


def per_clean_test(kind: object, rounds: int = ROUNDS) -> float:
    """Median microseconds of snapshot() + new_since() with nothing new."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        before = kind.snapshot()  # type: ignore[attr-defined]
        found = kind.new_since(before)  # type: ignore[attr-defined]
        samples.append(time.perf_counter() - start)
        assert not found
    return statistics.median(samples) * 1e6


def one_leak() -> float:
    """Milliseconds to find and describe one leaked pipe (the cost a leaking test pays)."""
    kind = FdKind()
    before = kind.snapshot()
    r, w = os.pipe()
    start = time.perf_counter()
    items = kind.new_since(before)
    kind.findings(items, "bench", grace=0.0)
    took = time.perf_counter() - start
    os.close(r)
    os.close(w)
    return took * 1e3


def main() -> int:
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(HELD_FDS)]
    try:
        figures = {
            "fds_us": per_clean_test(FdKind()),
            "ports_us": per_clean_test(PortKind()),
            "shm_us": per_clean_test(ShmKind()),
            "one_fd_leak_ms": (one_leak(), one_leak())[1],  # the first one pays the imports
        }
    finally:
        for fd in held:
            os.close(fd)
    figures["all_three_us"] = figures["fds_us"] + figures["ports_us"] + figures["shm_us"]
    if "--json" in sys.argv:
        print(json.dumps(figures))
        return 0
    print(f"OS-resource kinds, clean test, {HELD_FDS} fds held (median of {ROUNDS} rounds):")
    for key in ("fds_us", "ports_us", "shm_us", "all_three_us"):
        print(f"  {key[:-3]:<10} {figures[key]:7.1f} us")
    print(f"  budget for every kind of the guard together: {BUDGET_US:.0f} us")
    print(f"one leaked pipe found and described: {figures['one_fd_leak_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
