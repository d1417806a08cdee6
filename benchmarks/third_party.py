"""A third-party test suite plain and under the guard, side by side: time ratio and findings.

Not part of ``make test``: the suite comes from a PyPI sdist unpacked somewhere, installed (with
pytest-shutdown) into a side venv. Each test file runs plain (``-p no:shutdown``) and guarded
(``-p shutdown --shutdown-report=...``) back to back, the order alternating between rounds, so
that the load of a shared machine falls on both modes alike. Prints, per file and in total, the
wall times, the ratio guarded/plain, the outcomes, the guard's findings by code and the number
of long-lived resources listed.

    python benchmarks/third_party.py --python /tmp/side/venv/bin/python --cwd pebble-5.2.3 \\
        --rounds 2 test/test_thread_pool.py test/test_process_pool_fork.py
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

_OUTCOME = re.compile(r"^=*\s*(\d+ (?:passed|failed|error|skipped).*?) in [\d.]+s")


def run(python: str, cwd: str, target: str, guarded: bool, extra: list[str]) -> dict:
    report = Path(tempfile.mkdtemp()) / "report.json"
    mode = ["-p", "shutdown", f"--shutdown-report={report}"] if guarded else ["-p", "no:shutdown"]
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mode, *extra, target]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if _OUTCOME.search(line)]
    outcome = _OUTCOME.search(lines[-1]).group(1) if lines else f"exit {done.returncode}"
    result = {"wall_s": wall, "outcome": outcome, "findings": {}, "long_lived": 0, "guard_s": 0.0}
    if done.returncode not in (0, 5):  # keep the output of a failing run to read
        saved = report.with_name("output.txt")
        saved.write_text(done.stdout + done.stderr)
        result["outcome"] += f" (output: {saved})"
    if guarded and report.exists():
        data = json.loads(report.read_text())
        result["findings"] = data["summary"]["findings"]
        result["long_lived"] = len(data.get("long_lived", []))
        result["guard_s"] = data.get("guard_s", 0.0)
        result["flagged"] = [
            (t["nodeid"], [f["code"] for f in t["findings"]])
            for t in data["tests"]
            if t["findings"]
        ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the side venv's python")
    parser.add_argument("--cwd", required=True, help="the unpacked sdist")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    extra = args.pytest_args.split()
    totals: dict[bool, list[float]] = {False: [], True: []}
    flagged: Counter[tuple[str, str]] = Counter()
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}")
    for round_no in range(args.rounds):
        sums = {False: 0.0, True: 0.0}
        for target in args.files:
            order = (False, True) if round_no % 2 == 0 else (True, False)
            results = {g: run(args.python, args.cwd, target, g, extra) for g in order}
            plain, guarded = results[False], results[True]
            sums[False] += plain["wall_s"]
            sums[True] += guarded["wall_s"]
            for nodeid, codes in guarded.get("flagged", []):
                for code in codes:
                    flagged[(nodeid, code)] += 1
            print(
                f"round {round_no + 1} {target}: plain {plain['wall_s']:.1f} s ({plain['outcome']})"
                f" | guarded {guarded['wall_s']:.1f} s ({guarded['outcome']}), guard "
                f"{guarded['guard_s']:.2f} s, findings {guarded['findings'] or 'none'}, "
                f"long-lived {guarded['long_lived']} | ratio "
                f"{guarded['wall_s'] / plain['wall_s']:.3f}",
                flush=True,
            )
        for mode in (False, True):
            totals[mode].append(sums[mode])
        print(
            f"round {round_no + 1} total: plain {sums[False]:.1f} s, guarded {sums[True]:.1f} s,"
            f" ratio {sums[True] / sums[False]:.3f}",
            flush=True,
        )
    plain_sum, guarded_sum = sum(totals[False]), sum(totals[True])
    print(
        f"all rounds: plain {plain_sum:.1f} s, guarded {guarded_sum:.1f} s, "
        f"ratio {guarded_sum / plain_sum:.3f} (target <= 1.2 without real leaks)"
    )
    for (nodeid, code), count in sorted(flagged.items()):
        print(f"finding: {nodeid} [{code}] in {count} of {args.rounds} rounds")
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    sys.exit(main())
