"""Every benchmark of this folder, each in a fresh interpreter, then one summary table.

    .venv/bin/python benchmarks/run.py            # all but the suite (about an hour: the guard's
                                                  # budget alone takes 25-50 minutes)
    .venv/bin/python benchmarks/run.py --suite    # and the whole suite under `make test`
    .venv/bin/python benchmarks/run.py --only engine,os --markdown

Each benchmark is a small module of this directory, run as a script with ``--json`` so that its
figures come back as data; its own output (with every run and the ratios measured side by side)
is shown as it runs. A fresh interpreter per benchmark keeps them apart: the helper benchmark
pads the heap to 165,000 objects, the engine benchmark starts a fork server. Figures are
medians; the machine the figures come from is printed first. Nothing is asserted: a missed
target is reported as NOT MET.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from figures import Figure, markdown_table, read_json, table  # noqa: E402

#: name -> (script and its arguments, what it measures); in the order they run. Every figure
#: docs/benchmarks.md shows comes from one of these (tests/test_benchmarks.py checks the page).
BENCHMARKS: dict[str, tuple[tuple[str, ...], str]] = {
    "engine": (("engine_lifecycle.py",), "engine start-to-ready and graceful stop, vs spawn"),
    "orphans": (("orphan_matrix.py",), "tp=2 start/stop; the orphan matrix per cell and in total"),
    "guard": (
        ("guard_budget.py",),
        "the guard's budget: fixed cost, per-test slope, real suites (warn, fail), pid churn",
    ),
    "helpers": (("helpers.py",), "assertion helpers on a clean renderer; leak diagnosis at 165k"),
    "growth": (("growth.py",), "ReferenceLLM 10-cycle growth check; census at 200k; clean shapes"),
    "leaky": (
        ("leaky_suite.py",),
        "30 tests, one in three leaking a thread or a process for 1 s, and their clean twin: "
        "warn/plain and fail/plain",
    ),
    "harm": (
        ("third_party.py", "--suites",
         "pebble,loky,tqdm,joblib,execnet,pexpect,pyzmq,asgiref,janus,anyio,psutil,trio,"
         "pytest-xprocess,uvicorn,billiard", "--rounds", "1"),
        "fifteen real suites (issue 44's but sh, flaky plain; issue 48's asyncio and ZMQ ones; "
        "psutil, trio, pytest-xprocess, uvicorn, billiard), one round: per-test outcomes plain "
        "vs warn vs fail",
    ),
    "os": (("os_resources.py",), "the fds, ports and shm kinds' share of a clean test's check"),
    "distributed": (
        ("distributed_matrix.py",),
        "the distributed orphan matrix: 60 cells of frontend, EngineCores and gloo ranks",
    ),
    "distributed-dp": (
        ("distributed_matrix.py", "--dp-process-group", "gloo"),
        "the same 60 cells with the EngineCores in a gloo DP group of their own",
    ),
    "suite": (("suite.py",), "the whole suite under make test"),
}
#: The scripts a benchmark above runs as its parts (``guard_budget.py`` imports them; each also
#: runs alone), and the modules they share: every other script of this folder is listed above.
PARTS = {
    "guard_overhead.py": "guard",
    "third_party.py": "guard",
    "churn.py": "guard",
    "counted.py": "guard",
}
SHARED = ("figures.py", "runs.py", "run.py")
#: Each benchmark must end within this (every wait has a deadline); each run inside one has
#: its own, shorter deadline.
DEADLINE_S = 3600.0


def machine() -> list[str]:
    """Where the figures come from: CPUs, memory, CPU model, Python and torch versions."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = subprocess.run(
            ["free", "-h"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()[1].split()[1]
    except (OSError, IndexError, subprocess.SubprocessError):
        memory = "unknown"
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return [
        f"CPUs (nproc): {os.cpu_count()}; memory: {memory}; CPU: {model}",
        f"Python {platform.python_version()} ({sys.executable}); torch {torch}",
        f"load average at start: {load}",
    ]


def run_benchmark(name: str, workdir: Path) -> list[Figure]:
    """Run one benchmark script in a fresh interpreter; its figures, or none if it failed."""
    (script, *args), what = BENCHMARKS[name]
    out = workdir / f"{name}.json"
    print(f"\n=== {name}: {what}", flush=True)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / script), *args, "--json", str(out)], timeout=DEADLINE_S
        )
    except subprocess.TimeoutExpired:
        print(f"=== {name}: did not finish within {DEADLINE_S:.0f} s", flush=True)
        return []
    print(f"=== {name}: {time.perf_counter() - t0:.1f} s, exit {done.returncode}", flush=True)
    return read_json(out) if done.returncode == 0 and out.exists() else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="store_true", help="also time `make test` (minutes)")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--markdown", action="store_true", help="summary as a Markdown table")
    args = parser.parse_args(argv)
    names = [n for n in BENCHMARKS if n != "suite" or args.suite]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in BENCHMARKS]
        if unknown:
            parser.error(f"--only: unknown {', '.join(unknown)}; accepted: {', '.join(BENCHMARKS)}")
        names = [n for n in BENCHMARKS if n in wanted]

    print("\n".join(machine()))
    figures: list[Figure] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pytest-shutdown-bench-") as tmp:
        for name in names:
            got = run_benchmark(name, Path(tmp))
            figures += got
            if not got:
                failed.append(name)

    print("\n=== summary (medians; a shared machine: expect noise)")
    print(markdown_table(figures) if args.markdown else table(figures))
    for figure in figures:
        if figure.note:
            print(f"  {figure.name}: {figure.note}")
    missed = [f.name for f in figures if f.met is False]
    met = sum(f.met is True for f in figures)
    targets = sum(f.met is not None for f in figures)
    print(f"targets met: {met}/{targets}" + (f"; not met: {'; '.join(missed)}" if missed else ""))
    if failed:
        print(f"benchmarks that failed (no figures): {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
