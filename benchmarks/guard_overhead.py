"""The shutdown guard's overhead on a trivial suite: guard on vs plugin off, side by side.

Writes a 400-test suite of trivial tests into a temporary directory, then runs it alternately
with ``pytest -p shutdown`` (guard on, fail mode) and ``pytest -p no:shutdown`` (plugin not
loaded), several rounds each, and prints the median wall times, the ratio, and the overhead per
test. Target: under 10 % and under 1 ms per test when nothing leaks.

Both modes run with bytecode caching on (into a temporary ``PYTHONPYCACHEPREFIX``, whatever
``PYTHONDONTWRITEBYTECODE`` says), after one warm-up run each, as an installed plugin would:
otherwise every run would pay for compiling the plugin's modules from source.

    .venv/bin/python benchmarks/guard_overhead.py [--tests 400] [--rounds 9] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, write_json

SUITE = """
import pytest

@pytest.mark.parametrize("n", range({count}))
def test_trivial(n):
    assert n >= 0
"""

GUARD_ON = "guard on (-p shutdown)"
PLUGIN_OFF = "plugin off (-p no:shutdown)"
MODES = {
    GUARD_ON: ["-p", "shutdown"],
    PLUGIN_OFF: ["-p", "no:shutdown"],
}


def run_once(directory: Path, extra: list[str], env: dict[str, str]) -> float:
    """Wall time of one pytest run of the suite, in seconds; fails loudly if the run fails."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=300
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def measure(tests: int, rounds: int) -> dict[str, list[float]]:
    """Wall times of ``rounds`` runs per mode, alternating, after one warm-up run per mode."""
    with tempfile.TemporaryDirectory(prefix="guard-overhead-") as tmp:
        directory = Path(tmp)
        (directory / "test_trivial.py").write_text(SUITE.format(count=tests))
        env = dict(os.environ, PYTHONPYCACHEPREFIX=str(directory / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for extra in MODES.values():  # warm-up: bytecode and file caches
            run_once(directory, extra, env)
        for _ in range(rounds):
            for mode, extra in MODES.items():
                times[mode].append(run_once(directory, extra, env))
    return times


def figures(times: dict[str, list[float]], tests: int) -> list[Figure]:
    on = statistics.median(times[GUARD_ON])
    off = statistics.median(times[PLUGIN_OFF])
    return [
        Figure(f"{tests} trivial tests, guard on (median)", on, "s"),
        Figure(f"{tests} trivial tests, plugin off (median)", off, "s"),
        Figure("guard overhead ratio on/off", on / off, "x", limit=1.10),
        Figure("guard overhead per test", (on - off) / tests * 1000, "ms", limit=1.0),
    ]


def report(times: dict[str, list[float]], tests: int, rounds: int) -> list[Figure]:
    result = figures(times, tests)
    width = max(len(mode) for mode in MODES)
    print(f"{tests} trivial tests, {rounds} runs per mode (median wall time):")
    for mode, values in times.items():
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {mode:<{width}}  {statistics.median(values):7.3f} s   [{runs}]")
    ratio, per_test = result[2], result[3]
    print(f"  ratio on/off: {ratio.value:.3f} ({(ratio.value - 1) * 100:+.1f} %)")
    print(f"  overhead per test: {per_test.value:+.3f} ms")
    verdict = "within" if ratio.met and per_test.met else "OVER"
    print(f"  target (<= 10 % and <= 1 ms per test): {verdict}")
    return result


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=400, help="tests in the suite (400)")
    parser.add_argument("--rounds", type=int, default=9, help="runs per mode, alternating (9)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.tests < 1 or args.rounds < 1:
        parser.error("--tests and --rounds must be >= 1")
    result = report(measure(args.tests, args.rounds), args.tests, args.rounds)
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
