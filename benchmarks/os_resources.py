"""The OS-resource kinds' share of a clean test (issue 20): fds, ports and shm, on a process that
holds 200 file descriptors, and what one leak costs to describe.

    .venv/bin/python benchmarks/os_resources.py [--rounds 2000] [--json PATH]

A clean test costs the guard one path in its check (``ShutdownGuard._check``): it reads the
marks of every kind in one pass (:class:`pytest_shutdown._fast.marks.FingerprintPass`) and
compares them with the marks its set-up started from; equal, the test is clean and no kind is
asked anything more. (The set-up reads the pass too, but only one set-up in eight once the gaps
between tests are quiet.) This times that path, the pass built as the guard builds it (a kind
whose fingerprint other kinds on the run stand for, the ports kind's, is not in it), with every
kind on and with fds, ports and shm off; the difference is the three kinds' share: one ``fstat``
of ``/proc/self/fd`` with a ``dup`` and ``close`` for the lowest free number, one ``fstat`` of
``/dev/shm``. The two passes alternate, round by round; figures are medians, in microseconds.
Nothing is asserted; the per-test budget of issue 26 (0.1 ms, the guard's hooks included) is
printed beside every kind's check. What the whole guard costs per test is
``benchmarks/guard_budget.py``'s per-test slope.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from figures import Figure, write_json

from pytest_shutdown._fast.marks import FingerprintPass
from pytest_shutdown.resources import default_kinds, kind_names
from pytest_shutdown.resources.fds import FdKind

HELD_FDS = 200
ROUNDS = 2000
BUDGET_US = 100.0
OS_KINDS = ("fds", "ports", "shm")


def guard_pass(names: Sequence[str]) -> FingerprintPass:
    """The pass the guard compares around each test with the kinds ``names`` on (as
    ``ShutdownGuard.__init__`` builds it: without a kind whose ``fingerprinted_by`` kinds are
    all on)."""
    kinds = default_kinds(names)
    on = {kind.name for kind in kinds}
    return FingerprintPass(
        [
            kind
            for kind in kinds
            if not (others := getattr(kind, "fingerprinted_by", ()))
            or not all(name in on for name in others)
        ]
    )


def clean_checks(passes: Sequence[FingerprintPass], rounds: int) -> list[float]:
    """Median microseconds of each pass's clean check (read the marks, compare them with the
    last test's), the passes alternating round by round."""
    last: list[list[Any]] = [one.read() for one in passes]
    samples: list[list[float]] = [[] for _ in passes]
    for _ in range(rounds):
        for i, one in enumerate(passes):
            start = time.perf_counter()
            marks = one.read()
            same = marks == last[i]
            samples[i].append(time.perf_counter() - start)
            if not same:  # something of this process moved between two rounds: not clean
                last[i] = marks
    return [statistics.median(s) * 1e6 for s in samples]


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


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds ({ROUNDS})")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    every = kind_names()
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(HELD_FDS)]
    try:
        passes = [guard_pass(every), guard_pass([n for n in every if n not in OS_KINDS])]
        all_us, without_us = clean_checks(passes, args.rounds)
        leak_ms = (one_leak(), one_leak())[1]  # the first one pays the imports
    finally:
        for fd in held:
            os.close(fd)
    share_us = all_us - without_us
    figures = [
        Figure("clean check, every kind on", all_us, "us", BUDGET_US,
               note=f"{HELD_FDS} fds held, median of {args.rounds}"),
        Figure("clean check, fds, ports and shm off", without_us, "us"),
        Figure("fds + ports + shm, share of a clean check", share_us, "us"),
        Figure("one leaked pipe found and described", leak_ms, "ms"),
    ]
    print(f"the guard's clean check, {HELD_FDS} fds held (median of {args.rounds} rounds):")
    print(f"  every kind on               {all_us:7.1f} us (budget per test {BUDGET_US:.0f} us)")
    print(f"  fds, ports and shm off      {without_us:7.1f} us")
    print(f"  fds + ports + shm's share   {share_us:7.1f} us")
    print(f"one leaked pipe found and described: {leak_ms:.2f} ms")
    if args.json:
        write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()
