"""The shutdown guard's overhead on a trivial suite: guard on vs plugin off, side by side.

Writes a 400-test suite of trivial tests into a temporary directory, then runs it alternately
with ``pytest -p shutdown`` (guard on, fail mode) and ``pytest -p no:shutdown`` (plugin not
loaded), several rounds each, and prints the median wall times, the ratio, and the overhead per
test. Target: under 10 % and under 1 ms per test when nothing leaks.

Both modes run with bytecode caching on (into a temporary ``PYTHONPYCACHEPREFIX``, whatever
``PYTHONDONTWRITEBYTECODE`` says), after one warm-up run each, as an installed plugin would:
otherwise every run would pay for compiling the plugin's modules from source.

    .venv/bin/python benchmarks/guard_overhead.py [--tests 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """
import pytest

@pytest.mark.parametrize("n", range({count}))
def test_trivial(n):
    assert n >= 0
"""

MODES = {
    "guard on (-p shutdown)": ["-p", "shutdown"],
    "plugin off (-p no:shutdown)": ["-p", "no:shutdown"],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=400, help="tests in the suite (400)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per mode, alternating (5)")
    args = parser.parse_args()
    if args.tests < 1 or args.rounds < 1:
        parser.error("--tests and --rounds must be >= 1")

    with tempfile.TemporaryDirectory(prefix="guard-overhead-") as tmp:
        directory = Path(tmp)
        (directory / "test_trivial.py").write_text(SUITE.format(count=args.tests))
        env = dict(os.environ, PYTHONPYCACHEPREFIX=str(directory / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for extra in MODES.values():  # warm-up: bytecode and file caches
            run_once(directory, extra, env)
        for _ in range(args.rounds):
            for mode, extra in MODES.items():
                times[mode].append(run_once(directory, extra, env))

    on = statistics.median(times["guard on (-p shutdown)"])
    off = statistics.median(times["plugin off (-p no:shutdown)"])
    width = max(len(mode) for mode in MODES)
    print(f"{args.tests} trivial tests, {args.rounds} runs per mode (median wall time):")
    for mode, values in times.items():
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {mode:<{width}}  {statistics.median(values):7.3f} s   [{runs}]")
    ratio = on / off
    per_test_ms = (on - off) / args.tests * 1000
    print(f"  ratio on/off: {ratio:.3f} ({(ratio - 1) * 100:+.1f} %)")
    print(f"  overhead per test: {per_test_ms:+.3f} ms")
    verdict = "within" if ratio <= 1.10 and per_test_ms <= 1.0 else "OVER"
    print(f"  target (<= 10 % and <= 1 ms per test): {verdict}")


if __name__ == "__main__":
    main()
