"""Wall time of the whole test suite under ``make test``, with its slowest tests.

Runs ``make test PYTEST_ARGS="--durations=N -q"`` in the repository root (``TEST_WORKERS`` xdist
workers: the environment's, else the Makefile's default; the label names it), prints the wall
time, the slowest tests pytest reports and its summary line. Target: 3 minutes on 2 cores. Not a
test.

    .venv/bin/python benchmarks/suite.py [--durations 15] [--root DIR] [--pytest-args ARGS]
                                         [--json PATH]

``--root`` times another tree, e.g. a clean export of the last commit when the working tree
holds someone's unfinished tests (``git archive HEAD | tar -x -C DIR``, then link ``DIR/.venv``
to this venv: ``make`` finds it built and the tree's own ``pytest_shutdown`` is imported first).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, write_json

ROOT = Path(__file__).resolve().parent.parent
#: The suite must end within this; a run that does not is cut off (every wait has a deadline).
DEADLINE_S = 1800.0
TARGET_S = 180.0


def make_test_workers(root: Path = ROOT) -> str:
    """The ``-n`` that ``make test`` passes: ``TEST_WORKERS`` from the environment, else the
    Makefile's ``TEST_WORKERS ?= N`` default."""
    if os.environ.get("TEST_WORKERS"):
        return os.environ["TEST_WORKERS"]
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^TEST_WORKERS \?= *(\S+)", makefile, re.M)
    if match is None:
        raise SystemExit(f"{root / 'Makefile'} sets no TEST_WORKERS default")
    return match.group(1)


def run_suite(durations: int, root: Path = ROOT, extra: str = "") -> tuple[float, int, str]:
    """Wall time, exit status and output of one ``make test`` run in ``root``."""
    command = ["make", "-s", "test", f"PYTEST_ARGS=--durations={durations} -q {extra}".rstrip()]
    t0 = time.perf_counter()
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, timeout=DEADLINE_S,
        env=dict(os.environ),
    )
    return time.perf_counter() - t0, done.returncode, done.stdout + done.stderr


def slowest(output: str) -> list[str]:
    """The ``slowest durations`` block and the summary line of pytest's output."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "=" in line), None)
    block: list[str] = []
    if start is not None:
        for line in lines[start + 1:]:
            if line.startswith("=") or not line.strip():
                break
            block.append(line)
    summary = [line for line in lines if " passed" in line or " failed" in line][-1:]
    return block + [line for line in summary if line not in block]


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durations", type=int, default=15, help="slowest tests listed (15)")
    parser.add_argument("--root", type=Path, default=ROOT, help="tree to test (this one)")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments, e.g. --ignore=")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    wall, status, output = run_suite(args.durations, args.root, args.pytest_args)
    workers = make_test_workers(args.root)
    print(f"make test (pytest -n {workers}) in {args.root}, {os.cpu_count()} CPUs: "
          f"{wall:.1f} s wall, exit {status}")
    for line in slowest(output):
        print(f"  {line}")
    if status != 0:
        print("  WARNING: the suite did not pass; its wall time is not comparable")
        print("\n".join(f"  | {line}" for line in output.splitlines()[-30:]))
    result = [
        Figure(f"whole suite, make test (pytest -n {workers})", wall, "s", limit=TARGET_S,
               note=f"exit {status} {args.pytest_args}".rstrip()),
    ]
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
