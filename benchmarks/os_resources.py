"""The OS-resource kinds' cost per clean test (issue 20): fds, ports and shm, on a process that
holds 200 file descriptors, and what one leak costs to describe.

    .venv/bin/python benchmarks/os_resources.py [--json PATH]

Per clean test the guard reads each kind's fingerprint before and after it, in one pass
(:class:`pytest_shutdown.resources.marks.FingerprintPass`): one ``fstat`` of ``/proc/self/fd``
(fds, ports) and of ``/dev/shm`` (shm); a snapshot is taken only when a fingerprint moved.
Figures are medians of many rounds, in microseconds. Nothing is asserted; the budget (issue 26:
every kind together <= 0.1 ms per clean test) is printed beside them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from figures import Figure, write_json

from pytest_shutdown.resources.fds import FdKind
from pytest_shutdown.resources.marks import FingerprintPass
from pytest_shutdown.resources.ports import PortKind
from pytest_shutdown.resources.shm import ShmKind

HELD_FDS = 200
ROUNDS = 2000
BUDGET_US = 100.0


def per_clean_test(kind: object, rounds: int = ROUNDS) -> float:
    """Median microseconds of what the guard does for a clean test: the kind's fingerprint
    read (one pass) before and after it, compared; nothing moved, so no snapshot is taken."""
    one_pass = FingerprintPass([kind])  # type: ignore[list-item]
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        before = one_pass.read()
        moved = one_pass.read() != before
        samples.append(time.perf_counter() - start)
        assert not moved
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
    if "--json" in sys.argv[1:-1]:  # --json PATH: the figures for benchmarks/run.py
        write_json(
            sys.argv[sys.argv.index("--json") + 1],
            [
                Figure("fds kind, clean test", figures["fds_us"], "us"),
                Figure("ports kind, clean test", figures["ports_us"], "us"),
                Figure("shm kind, clean test", figures["shm_us"], "us"),
                Figure("fds + ports + shm, clean test", figures["all_three_us"], "us", BUDGET_US),
                Figure("one leaked pipe found and described", figures["one_fd_leak_ms"], "ms"),
            ],
        )
    print(f"OS-resource kinds, clean test, {HELD_FDS} fds held (median of {ROUNDS} rounds):")
    for key in ("fds_us", "ports_us", "shm_us", "all_three_us"):
        print(f"  {key[:-3]:<10} {figures[key]:7.1f} us")
    print(f"  budget for every kind of the guard together: {BUDGET_US:.0f} us")
    print(f"one leaked pipe found and described: {figures['one_fd_leak_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
