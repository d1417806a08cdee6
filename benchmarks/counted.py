"""The guard's cost on trivial tests, counted instead of timed: instructions and system calls.

On a shared virtual machine a pure-CPU loop varies by 25 % from one run to the next, so a timed
difference of 0.1 ms per test (10 % of a trivial pytest test here) drowns in the run-to-run
spread unless many rounds are taken. Counts do not move with the load:

* **instructions** (user space) of whole sessions of 1, 400 and 1600 trivial tests, plain
  (``-p no:shutdown``) and guarded (``-p shutdown``), under ``valgrind --tool=callgrind`` (one
  run each: the count is the same every time for the same interpreter, files and arguments);
* **system calls** of the same sessions under ``strace -f -c`` (the kernel's part, which
  callgrind does not count).

The per-test slope and the fixed cost are formed as in :mod:`guard_overhead`
(``((g1600 - p1600) - (g400 - p400)) / 1200``; guarded - plain at 1 test) and turned into time
with this machine's own rates: nanoseconds per instruction of the plain 1600-test session (its
wall time, median of 3 timed runs, over its instructions) and microseconds per system call (a
timed ``fstat``/``pread`` of a held file). Both sessions share the same interpreter flags and a
warmed bytecode cache. The fixed cost so turned into time has no verdict: its instructions
(imports and the collections they trigger) run at about half that speed, so it is a lower
bound; the timed figure of :mod:`guard_overhead` is the one to hold to the target.

    .venv/bin/python benchmarks/counted.py [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import timeit
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, report
from guard_overhead import BASE, GUARDED, PLAIN, SLOPE_LIMIT_MS, _suite, timed
from runs import bytecode_env, load_average, run_command

SIZES = (1, 400, 1600)
#: A callgrind run of 1600 trivial tests takes a few minutes here.
COUNT_TIMEOUT_S = 1800.0


def instructions(folder: Path, mode: list[str], env: dict[str, str], tmp: Path) -> int:
    """User-space instructions of one session (every process it starts included)."""
    out = tmp / f"cg-{folder.name}-{mode[-1].replace(':', '_')}.%p"
    command = [
        "valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}",
        sys.executable, *BASE, *mode,
    ]
    done = run_command(command, cwd=folder, env=env, timeout_s=COUNT_TIMEOUT_S)
    if done.returncode != 0 or done.timed_out:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr[-2000:]}")
    total = 0
    for path in tmp.glob(out.name.replace("%p", "*")):
        match = re.search(r"^summary: (\d+)", path.read_text(errors="replace"), re.MULTILINE)
        if match:
            total += int(match.group(1))
        path.unlink()
    return total


def system_calls(folder: Path, mode: list[str], env: dict[str, str], tmp: Path) -> int:
    """System calls of one session (every thread and child process included)."""
    out = tmp / "strace.txt"
    command = ["strace", "-f", "-c", "-o", str(out), sys.executable, *BASE, *mode]
    done = run_command(command, cwd=folder, env=env, timeout_s=COUNT_TIMEOUT_S)
    if done.returncode != 0 or done.timed_out:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr[-2000:]}")
    lines = out.read_text().splitlines()
    total = next(line for line in reversed(lines) if line.rstrip().endswith("total"))
    fields = total.split()
    return int(fields[3])  # % time, seconds, usecs/call, calls, [errors,] "total"


def syscall_us() -> float:
    """Microseconds per cheap system call here (``fstat`` of a held folder, ``pread``)."""
    fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        per = min(timeit.repeat(lambda: os.fstat(fd), number=20000, repeat=5)) / 20000
    finally:
        os.close(fd)
    return per * 1e6


def measure() -> list[Figure]:
    missing = [tool for tool in ("valgrind", "strace") if shutil.which(tool) is None]
    if missing:
        print(f"counted figures skipped: {', '.join(missing)} not on PATH")
        return []
    with tempfile.TemporaryDirectory(prefix="guard-counted-") as tmp_name:
        tmp = Path(tmp_name)
        env = bytecode_env(tmp / "pycache")
        suites = {count: _suite(tmp, count) for count in SIZES}
        for mode in (PLAIN, GUARDED):  # bytecode written once, outside any count
            timed(suites[1], mode, env)
        load = load_average()
        counts: dict[tuple[str, int], tuple[int, int]] = {}
        for count in SIZES:
            for name, mode in (("plain", PLAIN), ("guarded", GUARDED)):
                counts[(name, count)] = (
                    instructions(suites[count], mode, env, tmp),
                    system_calls(suites[count], mode, env, tmp),
                )
                ins, calls = counts[(name, count)]
                print(
                    f"  {name:<7} {count:>4} tests: {ins:>14,} instructions, "
                    f"{calls:>7,} system calls"
                )
        walls = [timed(suites[1600], PLAIN, env)[0] for _ in range(3)]
    ns_per_instruction = statistics.median(walls) * 1e9 / counts[("plain", 1600)][0]
    us_per_call = syscall_us()
    print(
        f"rates here: {ns_per_instruction:.3f} ns per instruction (plain 1600-test session, "
        f"{statistics.median(walls):.2f} s), {us_per_call:.2f} us per system call (load {load})"
    )

    def diff(index: int, count: int) -> int:
        return counts[("guarded", count)][index] - counts[("plain", count)][index]

    slope_ins = (diff(0, 1600) - diff(0, 400)) / 1200
    slope_calls = (diff(1, 1600) - diff(1, 400)) / 1200
    slope_ms = (slope_ins * ns_per_instruction / 1e6) + slope_calls * us_per_call / 1000
    fixed_ms = diff(0, 1) * ns_per_instruction / 1e6 + diff(1, 1) * us_per_call / 1000
    ratio = {
        count: (counts[("guarded", count)][0] / counts[("plain", count)][0]) for count in SIZES
    }
    note = f"load {load}; {ns_per_instruction:.3f} ns/instruction, {us_per_call:.2f} us/call"
    return [
        Figure("guard per-test slope, counted: instructions", slope_ins, "instructions"),
        Figure("guard per-test slope, counted: system calls", slope_calls, "calls"),
        Figure(
            "guard per-test slope, counted, as time here", slope_ms, "ms", limit=SLOPE_LIMIT_MS,
            note=note,
        ),
        Figure("guard fixed cost, counted: instructions", diff(0, 1), "instructions"),
        Figure("guard fixed cost, counted: system calls", diff(1, 1), "calls"),
        # No verdict: the fixed cost's instructions (imports, unmarshalling, the collections
        # they trigger) run at about half the speed of the plain session's (2026-12-03: 39.5 ms
        # of user time for 82 M instructions), so at that rate this reads low: a lower bound.
        Figure(
            "guard fixed cost, counted, at the plain session's rate (a lower bound)",
            fixed_ms,
            "ms",
            note=note,
        ),
        Figure("guard instruction ratio, 400 trivial tests", ratio[400], "x"),
        Figure("guard instruction ratio, 1600 trivial tests", ratio[1600], "x"),
    ]


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result = measure()
    return report(result, args.json, ",.3f")


if __name__ == "__main__":
    main()
