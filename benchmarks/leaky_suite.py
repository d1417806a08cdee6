"""A suite that leaks, and its clean twin, plain and under the guard: what a leak costs (issue 44).

Two generated suites of 30 tests each, every test doing about 0.1 s of work (a sleep: the
figure is the guard's waiting, not the CPU of a shared machine):

* **leaky**: one test in three also leaks something that ends by itself 1 s later, a thread
  and a child process in turn (5 threads, 5 processes);
* **clean**: the same 30 tests without the leaks.

Each suite runs plain (``-p no:shutdown``), guarded in warn mode and guarded in fail mode
(``-p shutdown --shutdown-guard=warn|fail``), the order turning each round, with this project's
venv python, ``-p no:randomly -p no:cacheprovider`` and bytecode caching on. Per suite it prints
every run, then the ratios warn/plain and fail/plain (medians of the rounds' ratios) with their
targets: on the leaky suite warn <= 1.05 (warn mode reports a leak and moves on, it does not
wait for it) and fail <= 1.10; on the clean suite <= 1.05 both. A guard that waits out its grace
(2 s by default) for each leak adds up to 10 x 2 s to the leaky suite's 3 s of work.

    .venv/bin/python benchmarks/leaky_suite.py [--rounds 5] [--json P]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, write_json
from runs import Run, bytecode_env, load_average, run_command

ROOT = Path(__file__).resolve().parent.parent
TESTS = 30
#: One test in LEAK_EVERY leaks (thread and process in turn).
LEAK_EVERY = 3
WORK_S = 0.1
LEAK_S = 1.0
MODES = ("plain", "warn", "fail")
#: name -> {mode: target of mode/plain}.
TARGETS = {"leaky": {"warn": 1.05, "fail": 1.10}, "clean": {"warn": 1.05, "fail": 1.05}}
ROUNDS = 5
#: A run's deadline: the leaky suite guarded takes 3 s of work plus, at worst, 10 full graces.
RUN_TIMEOUT_S = 180.0

HEADER = '''
import subprocess
import sys
import threading
import time

import pytest

WORK_S = {work}
LEAK_S = {leak}


def leak_thread():
    threading.Thread(target=time.sleep, args=(LEAK_S,), name="leaky-sleeper").start()


def leak_process():
    # Never waited for: it ends by itself LEAK_S later.
    subprocess.Popen([sys.executable, "-S", "-c", f"import time; time.sleep({{LEAK_S}})"])
'''

TEST = '''

def test_{n:02d}():
    time.sleep(WORK_S){leak}
'''


def python() -> str:
    """This project's venv python (the plugin installed there), else this interpreter."""
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def write_suite(folder: Path, leaky: bool) -> Path:
    """The suite's folder: ``test_suite.py`` with TESTS tests, one in LEAK_EVERY leaking."""
    folder.mkdir(parents=True)
    parts = [HEADER.format(work=WORK_S, leak=LEAK_S)]
    for n in range(TESTS):
        leak = ""
        if leaky and n % LEAK_EVERY == 0:
            kind = "thread" if (n // LEAK_EVERY) % 2 == 0 else "process"
            leak = f"\n    leak_{kind}()"
        parts.append(TEST.format(n=n, leak=leak))
    (folder / "test_suite.py").write_text("".join(parts))
    (folder / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no ini found above
    return folder


def mode_args(mode: str) -> list[str]:
    if mode == "plain":
        return ["-p", "no:shutdown"]
    return ["-p", "shutdown", f"--shutdown-guard={mode}"]


def run_once(folder: Path, mode: str, env: dict[str, str], extra: Sequence[str] = ()) -> Run:
    command = [
        python(), "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
        *mode_args(mode), *extra,
    ]
    return run_command(command, cwd=folder, env=env, timeout_s=RUN_TIMEOUT_S)


def summary(done: Run) -> str:
    if done.timed_out:
        return f"timeout after {RUN_TIMEOUT_S:.0f} s"
    lines = [
        line
        for line in done.stdout.splitlines()
        if " in " in line and line[:1] in "=0123456789"
    ]
    text = lines[-1].strip("= ") if lines else "no summary"
    return text + ("" if done.returncode in (0, 1) else f" (exit {done.returncode})")


def measure(rounds: int) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="leaky-suite-") as tmp:
        base = Path(tmp)
        env = bytecode_env(base / "pycache")
        suites = {name: write_suite(base / name, name == "leaky") for name in TARGETS}
        for folder in suites.values():  # warm-up: bytecode, page cache
            for mode in ("plain", "fail"):
                run_once(folder, mode, env, ["--collect-only"])
        walls: dict[str, dict[str, list[float]]] = {s: {m: [] for m in MODES} for s in suites}
        outcomes: dict[str, Counter[str]] = {}
        load = load_average()
        print(f"load {load}; {python()}", flush=True)
        for round_no in range(rounds):
            order = MODES[round_no % 3 :] + MODES[: round_no % 3]
            for name, folder in suites.items():
                for mode in order:
                    done = run_once(folder, mode, env)
                    walls[name][mode].append(done.wall_s)
                    outcomes.setdefault(f"{name} {mode}", Counter())[summary(done)] += 1
                    print(
                        f"  round {round_no + 1} {name:<5} {mode:<5} {done.wall_s:6.2f} s wall "
                        f"{done.cpu_s:6.2f} s CPU  {summary(done)}"
                        + ("; LEFT PROCESSES BEHIND (killed)" if done.left_behind else ""),
                        flush=True,
                    )
        note_load = f"load {load} .. {load_average()}"
        for key, seen in outcomes.items():
            print(f"  {key}: {', '.join(f'{text} (x{count})' for text, count in seen.items())}")
        for name, per_mode in walls.items():
            plain = per_mode["plain"]
            for mode in ("warn", "fail"):
                ratios = [g / p for g, p in zip(per_mode[mode], plain, strict=True)]
                figure = Figure(
                    f"{name} suite ({TESTS} tests) {mode}/plain",
                    statistics.median(ratios),
                    "x",
                    limit=TARGETS[name][mode],
                    note=f"plain {statistics.median(plain):.2f} s, {mode} "
                    f"{statistics.median(per_mode[mode]):.2f} s; rounds "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}; {note_load}",
                )
                figures.append(figure)
    return figures


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds ({ROUNDS})")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    figures = measure(args.rounds)
    for figure in figures:
        verdict = "PASS" if figure.met else "MISS"
        print(f"{figure.name}: {figure.value:.3f} {figure.unit} [{verdict}: {figure.target}]")
        print(f"    {figure.note}")
    if args.json:
        write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()
