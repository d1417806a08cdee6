"""The shutdown guard's cost on trivial tests: fixed per session, and per test (slope method).

Method (issue 26), everything side by side and alternating, the order turning each round:

* **per-test slope**: suites of 400 and 1600 trivial tests, each run plain (``-p no:shutdown``,
  the plugin not loaded) and guarded (``-p shutdown``, fail mode); per round
  ``((g1600 - p1600) - (g400 - p400)) / 1200``, i.e. the guard's extra time per extra test with
  every per-session cost cancelled out; the figure is the median over the rounds (3). The
  ratios guarded/plain at 400 and at 1600 tests are the medians of the rounds' ratios.
* **fixed cost per session**: a 1-test suite, guarded minus plain (median of 11 rounds, 151 in
  ``run.py --only guard``). The issue's figure is the plugin's import plus the session's
  set-up: the time from starting the process to pytest's run loop (a marker plugin, loaded
  in both modes through ``PYTEST_PLUGINS``, notes when ``pytest_runtestloop`` starts). The
  whole 1-test session's difference is printed beside it: it also holds the one test, the
  session's end and the interpreter's exit, which unloads every module the plugin loaded
  (about as long as importing them). The plugin's own import time is shown too (a fresh
  interpreter times importing every module a guarded session adds after pytest's own), with
  the intercept of the slope runs (``(g400 - p400) - 400 * slope``) as a cross-check.

Every run uses the same interpreter and flags (``python -m pytest -q -p no:cacheprovider
-p no:randomly``) and bytecode caching on in both modes (a fresh ``PYTHONPYCACHEPREFIX``, warmed
by one run per mode): an installed plugin loads its modules from bytecode. The figure without
the cache (``PYTHONDONTWRITEBYTECODE=1``, which this machine sets: every session compiles the
plugin from source) is printed too, since that is how the earlier, larger figures were taken.

    .venv/bin/python benchmarks/guard_overhead.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, report
from runs import bytecode_env, load_average, run_command

SUITE = """
import pytest

@pytest.mark.parametrize("n", range({count}))
def test_trivial(n):
    assert n >= 0
"""

PLAIN = ["-p", "no:shutdown"]
GUARDED = ["-p", "shutdown"]
#: The plugin installed and loaded, guard off (no -p): what every session of a user pays.
INSTALLED_OFF: list[str] = []
BASE = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
SIZES = (400, 1600)
#: Targets of issue 26.
SLOPE_LIMIT_MS = 0.1
FIXED_LIMIT_MS = 30.0
RUN_TIMEOUT_S = 300.0
#: Rounds of the 1-test sessions without bytecode cache (how earlier figures were taken).
UNCACHED_ROUNDS = 21


def _suite(directory: Path, count: int) -> Path:
    folder = directory / f"suite{count}"
    folder.mkdir()
    (folder / "test_trivial.py").write_text(SUITE.format(count=count))
    return folder


#: The marker plugin of the 1-test runs (both modes): the moment pytest's run loop starts.
SETUP_MARK_PLUGIN = """
import os, time
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    with open(os.environ["GUARD_BENCH_SETUP_MARK"], "w") as mark:
        mark.write(repr(time.monotonic()))
"""
SETUP_MARK_MODULE = "guard_bench_setup_mark"


def setup_mark_env(directory: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the marker plugin loaded (``PYTEST_PLUGINS``: no entry-point scan) and its
    file under ``directory``."""
    folder = directory / "setup-mark"
    folder.mkdir(exist_ok=True)
    (folder / f"{SETUP_MARK_MODULE}.py").write_text(SETUP_MARK_PLUGIN)
    path = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return dict(
        env,
        PYTHONPATH=path,
        PYTEST_PLUGINS=SETUP_MARK_MODULE,
        GUARD_BENCH_SETUP_MARK=str(folder / "mark"),
    )


def timed(folder: Path, mode: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall and CPU time of one run, in seconds, and the time from its start to pytest's run
    loop (NaN without the marker plugin); fails loudly if the run fails."""
    command = [sys.executable, *BASE, *mode]
    mark = env.get("GUARD_BENCH_SETUP_MARK")
    if mark:
        Path(mark).unlink(missing_ok=True)
    start = time.monotonic()  # the clock the marker reads, in every process of this machine
    done = run_command(command, cwd=folder, env=env, timeout_s=RUN_TIMEOUT_S)
    if done.returncode != 0 or done.timed_out:
        raise SystemExit(f"{' '.join(command)} failed in {folder}:\n{done.stdout}\n{done.stderr}")
    setup = float(Path(mark).read_text()) - start if mark else float("nan")
    return done.wall_s, done.cpu_s, setup


#: name -> (wall times, CPU times, times to the run loop), one per round.
Times = dict[str, tuple[list[float], list[float], list[float]]]


def alternate(runs: dict[str, tuple[Path, list[str]]], rounds: int, env: dict[str, str]) -> Times:
    """``rounds`` times per named run, the order turning by one each round."""
    names = list(runs)
    times: Times = {name: ([], [], []) for name in names}
    for round_no in range(rounds):
        turn = round_no % len(names)
        for name in names[turn:] + names[:turn]:
            folder, mode = runs[name]
            for values, value in zip(times[name], timed(folder, mode, env), strict=True):
                values.append(value)
    return times


#: Run in a fresh interpreter: a plain session first (pytest's own imports), then the time of
#: importing what a guarded session adds: the plugin, the guard, its reports and every kind.
_IMPORT_PROBE = """
import contextlib, io, sys, time
import pytest
with contextlib.redirect_stdout(io.StringIO()):
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:shutdown"])
start = time.perf_counter()
import pytest_shutdown.plugin, pytest_shutdown.plugin.fixtures
import pytest_shutdown.plugin.contract_errors, pytest_shutdown.plugin.report
import pytest_shutdown.plugin.interrupts, pytest_shutdown.plugin.guard
from pytest_shutdown.resources import default_kinds
default_kinds()
print((time.perf_counter() - start) * 1000)
"""


def plugin_import_ms(folder: Path, env: dict[str, str], repeat: int = 5) -> float:
    """Median over ``repeat`` fresh interpreters of the time a guarded session spends importing
    pytest-shutdown's modules (and what only they import), after pytest's own imports. (``-X
    importtime`` cannot tell: it misses what ``importlib.import_module`` loads, the entry
    point and the kinds included.)"""
    values = []
    for _ in range(repeat):
        command = [sys.executable, "-c", _IMPORT_PROBE]
        done = run_command(command, cwd=folder, env=env, timeout_s=RUN_TIMEOUT_S)
        values.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(values)


def measure(rounds: int, fixed_rounds: int) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="guard-overhead-") as tmp:
        directory = Path(tmp)
        env = bytecode_env(directory / "pycache")
        marked_env = setup_mark_env(directory, env)
        one = _suite(directory, 1)
        suites = {count: _suite(directory, count) for count in SIZES}
        for mode in (PLAIN, GUARDED, INSTALLED_OFF):  # warm-up: bytecode and file caches
            timed(one, mode, marked_env)

        load = load_average()
        fixed = alternate(
            {"plain": (one, PLAIN), "guarded": (one, GUARDED), "off": (one, INSTALLED_OFF)},
            fixed_rounds,
            marked_env,
        )
        import_ms = plugin_import_ms(one, env)
        nocache_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        nocache_env.pop("PYTHONPYCACHEPREFIX", None)
        uncached = alternate(  # shown, never held to a target: fewer rounds
            {"plain": (one, PLAIN), "guarded": (one, GUARDED)},
            min(fixed_rounds, UNCACHED_ROUNDS),
            nocache_env,
        )
        print(f"1-test session, {fixed_rounds} alternating rounds (load {load}):")
        _print_times(fixed)
        print(f"  plugin import (its modules after pytest's, median of 5): {import_ms:.1f} ms")
        print(
            "  without bytecode cache (PYTHONDONTWRITEBYTECODE=1), "
            f"{min(fixed_rounds, UNCACHED_ROUNDS)} rounds:"
        )
        _print_times(uncached)

        load_slope = load_average()
        runs = {}
        for count in SIZES:
            runs[f"plain {count}"] = (suites[count], PLAIN)
            runs[f"guarded {count}"] = (suites[count], GUARDED)
        times = alternate(runs, rounds, env)
        print(f"trivial tests, {rounds} alternating rounds (load {load_slope}):")
        _print_times(times)
        calls = profile_calls_per_test(suites[SIZES[-1]], SIZES[-1], env, directory)
        load_after = load_average()

    figures: list[Figure] = [
        Figure(
            f"guard's extra Python calls per test (cProfile, {SIZES[-1]} tests)",
            calls,
            "calls",
            note="counted, not timed: the load does not move it",
        )
    ]
    note = f"load {load} .. {load_after}"
    setup_ms = _median_diff_ms(fixed["guarded"][2], fixed["plain"][2])
    figures += [
        Figure(
            "guard fixed cost per session: plugin import + session set-up (to the run loop)",
            setup_ms,
            "ms",
            limit=FIXED_LIMIT_MS,
            note=f"the issue's fixed cost; plugin import {import_ms:.1f} ms; installed, guard "
            f"off: {_median_diff_ms(fixed['off'][2], fixed['plain'][2]):.1f} ms; {note}",
        )
    ]
    for metric, label in ((0, ""), (1, ", CPU")):
        fixed_ms = _median_diff_ms(fixed["guarded"][metric], fixed["plain"][metric])
        uncached_ms = _median_diff_ms(uncached["guarded"][metric], uncached["plain"][metric])
        slopes, intercepts, ratios = _slopes(times, rounds, metric)
        print(
            f"{'CPU time' if metric else 'wall time'}: per-test slope per round "
            f"{', '.join(f'{x:.3f}' for x in slopes)} ms; intercept per round "
            f"{', '.join(f'{x:.0f}' for x in intercepts)} ms"
        )
        figures += [
            Figure(
                f"guard extra per whole 1-test session (set-up, test, end, exit){label}",
                fixed_ms,
                "ms",
                note=f"plugin import {import_ms:.1f} ms; intercept of the slope runs "
                f"{statistics.median(intercepts):.0f} ms; without bytecode cache "
                f"{uncached_ms:.0f} ms; {note}",
            ),
            Figure(
                f"plugin installed, guard off, per session{label}",
                _median_diff_ms(fixed["off"][metric], fixed["plain"][metric]),
                "ms",
            ),
            Figure(
                f"guard per-test slope (t1600-t400)/1200{label}",
                statistics.median(slopes),
                "ms",
                limit=SLOPE_LIMIT_MS,
                note=f"rounds {', '.join(f'{x:.3f}' for x in slopes)} ms; {note}",
            ),
        ]
        for count in SIZES:
            figures.append(
                Figure(
                    f"guard ratio, {count} trivial tests{label}",
                    statistics.median(ratios[count]),
                    "x",
                    note=f"plain {statistics.median(times[f'plain {count}'][metric]):.3f} s, "
                    f"guarded {statistics.median(times[f'guarded {count}'][metric]):.3f} s; "
                    + note,
                )
            )
    return figures


def profile_calls_per_test(folder: Path, count: int, env: dict[str, str], tmp: Path) -> float:
    """Python function calls per test that the guard adds (``cProfile`` of a guarded and a
    plain session of ``count`` trivial tests), and the guard's own functions by self time."""
    stats = {}
    for name, mode in (("plain", PLAIN), ("guarded", GUARDED)):
        out = tmp / f"{name}.prof"
        command = [sys.executable, "-m", "cProfile", "-o", str(out), *BASE, *mode]
        done = run_command(command, cwd=folder, env=env, timeout_s=RUN_TIMEOUT_S)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
        stats[name] = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    total = {name: sum(row[1] for row in data.values()) for name, data in stats.items()}
    guarded = stats["guarded"].items()
    own = sorted(
        ((row[2], row[1], key) for key, row in guarded if "pytest_shutdown" in key[0]),
        reverse=True,
    )
    print(f"cProfile, {count} trivial tests: the guard's functions by self time (ms per test):")
    for self_s, calls, (filename, line, function) in own[:8]:
        where = filename.split("pytest_shutdown/")[-1]
        print(f"  {self_s / count * 1000:6.3f} ms  {calls:6d} calls  {where}:{line} {function}")
    return (total["guarded"] - total["plain"]) / count


def _slopes(
    times: Times, rounds: int, metric: int
) -> tuple[list[float], list[float], dict[int, list[float]]]:
    """Per round: the slope and intercept (ms) of guarded - plain, and the ratios per size."""
    small, large = SIZES
    slopes, intercepts = [], []
    ratios: dict[int, list[float]] = {count: [] for count in SIZES}
    for r in range(rounds):
        value = {name: values[metric][r] for name, values in times.items()}
        d_small = value[f"guarded {small}"] - value[f"plain {small}"]
        d_large = value[f"guarded {large}"] - value[f"plain {large}"]
        slope = (d_large - d_small) / (large - small)
        slopes.append(slope * 1000)
        intercepts.append((d_small - small * slope) * 1000)
        for count in SIZES:
            ratios[count].append(value[f"guarded {count}"] / value[f"plain {count}"])
    return slopes, intercepts, ratios


def _median_diff_ms(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True)) * 1000


def _print_times(times: Times) -> None:
    for name, (walls, cpus, setups) in times.items():
        setup = (
            f"; to the run loop median {statistics.median(setups):.3f} s"
            if setups and not math.isnan(setups[0])  # the marker plugin was loaded
            else ""
        )
        print(
            f"  {name:<13} wall median {statistics.median(walls):.3f} s "
            f"[{', '.join(f'{v:.3f}' for v in walls)}]; CPU median {statistics.median(cpus):.3f} s"
            + setup
        )


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the slope runs (3)")
    parser.add_argument("--fixed-rounds", type=int, default=11, help="rounds, 1-test suite (11)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.fixed_rounds < 1:
        parser.error("--rounds and --fixed-rounds must be >= 1")
    result = measure(args.rounds, args.fixed_rounds)
    return report(result, args.json)


if __name__ == "__main__":
    main()
