"""The guard under host pid churn: a session server, a thread per test, 300+ churning processes.

The case of the containment issue (19, item 2): a suite whose session-scoped fixture keeps a
server process alive, each of whose 2000 tests starts and joins a thread, run while 300+
unrelated processes on the host come and go (so pids are allocated all the time and the process
table is large). A per-test check that scans the host's process table whenever a pid was
allocated pays for the host, not for the test. Target: guarded/plain <= 1.2.

The churners are this benchmark's own: one churner process in a session of its own keeps
``--churners`` ``sleep`` processes alive, each living 1-2 s and replaced when it ends (about
200 new pids a second). The churner dies with this process (``PR_SET_PDEATHSIG``), stops by
itself at its deadline, and is ended with its whole process group (SIGKILL) when the
measurement is over; every ``sleep`` ends by itself within 2 s in any case. What is left of the
group afterwards is counted and printed (it should be 0).

    .venv/bin/python benchmarks/churn.py [--tests 2000] [--churners 300] [--rounds 3] [--json P]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from figures import Figure, report
from runs import bytecode_env, group_members, load_average, run_command

SUITE = """
import subprocess
import sys
import threading

import pytest

SERVER = "import sys\\nfor line in sys.stdin:\\n    sys.stdout.write(line)\\n    sys.stdout.flush()"


@pytest.fixture(scope="session")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    proc.stdin.write("ready\\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "ready\\n"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()


@pytest.mark.parametrize("n", range({count}))
def test_thread_per_test(server, n):
    done = []
    thread = threading.Thread(target=done.append, args=(n,))
    thread.start()
    thread.join(timeout=30)
    assert done == [n] and server.poll() is None
"""

#: The churner: keeps COUNT sleeps of 1-2 s alive until its deadline; dies with its parent.
CHURNER = r"""
import ctypes, os, random, signal, sys, time
count, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[3]):
    sys.exit(1)  # the benchmark is already gone
alive = 0
spawned = 0
if count == 0:
    print("ready", flush=True)
while time.monotonic() < deadline:
    while alive < count:
        life = min(random.uniform(1.0, 2.0), max(deadline - time.monotonic(), 0.0))
        os.posix_spawnp("sleep", ["sleep", f"{life:.3f}"], os.environ)
        alive += 1
        spawned += 1
        if spawned == count:
            print("ready", flush=True)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            alive = 0
            break
        if pid == 0:
            break
        alive -= 1
    time.sleep(0.01)
"""

PLAIN = ["-p", "no:shutdown"]
GUARDED = ["-p", "shutdown"]
BASE = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
RATIO_LIMIT = 1.2
RUN_TIMEOUT_S = 600.0


class Churners:
    """``count`` short-lived unrelated processes, replaced as they end, until ``stop()``."""

    def __init__(self, count: int, deadline_s: float) -> None:
        self.count = count
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHURNER, str(count), str(deadline_s), str(os.getpid())],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise SystemExit("the churner did not start")

    def stop(self) -> int:
        """SIGKILL the churner's whole group, reap the churner; the group's survivors (0)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 10
        while (left := group_members(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILLed sleeps are reaped by whoever adopted them
        return len(left)


def process_count() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def last_pid() -> int:
    try:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except (OSError, ValueError):
        return 0


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22


def measure(tests: int, churners: int, rounds: int) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="guard-churn-") as tmp:
        directory = Path(tmp)
        (directory / "test_churn.py").write_text(SUITE.replace("{count}", str(tests)))
        env = bytecode_env(directory / "pycache")
        modes = {"plain": PLAIN, "guarded": GUARDED}
        times: dict[str, list[float]] = {name: [] for name in modes}
        deadline_s = RUN_TIMEOUT_S * 2 * (rounds + 1) + 60
        churn = Churners(churners, deadline_s)
        left = -1
        try:
            time.sleep(2.5)  # one generation of sleeps ended and replaced: churning steadily
            load = load_average()
            host = process_count()
            pid_before, t_before = last_pid(), time.monotonic()
            time.sleep(3.0)  # the churn rate alone (pids wrap at pid_max: a short window)
            pids_per_s = ((last_pid() - pid_before) % pid_max()) / (time.monotonic() - t_before)
            for mode in modes.values():  # warm-up: bytecode and file caches
                _timed(directory, mode, env)
            for round_no in range(rounds):
                order = list(modes) if round_no % 2 == 0 else list(modes)[::-1]
                for name in order:
                    times[name].append(_timed(directory, modes[name], env))
                    print(f"  round {round_no + 1} {name}: {times[name][-1]:.2f} s", flush=True)
            load_after = load_average()
        finally:
            left = churn.stop()
    ratios = [g / p for g, p in zip(times["guarded"], times["plain"], strict=True)]
    ratio = statistics.median(ratios)
    print(
        f"{tests} tests (session server, a thread per test), {churners} churning processes "
        f"({host} processes on the host, ~{pids_per_s:.0f} new pids/s before the runs); "
        f"load {load} .. {load_after}"
    )
    for name, values in times.items():
        print(f"  {name:<8} median {statistics.median(values):.2f} s  [" +
              ", ".join(f"{v:.2f}" for v in values) + "]")
    print(f"  ratios per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"  churners left after the stop: {left}")
    return [
        Figure(
            f"guard ratio under pid churn ({tests} tests, {churners} churners)",
            ratio,
            "x",
            limit=RATIO_LIMIT,
            note=f"plain {statistics.median(times['plain']):.2f} s, guarded "
            f"{statistics.median(times['guarded']):.2f} s; {host} processes, "
            f"~{pids_per_s:.0f} pids/s; churners left {left}; load {load} .. {load_after}",
        )
    ]


def _timed(directory: Path, mode: list[str], env: dict[str, str]) -> float:
    command = [sys.executable, *BASE, *mode]
    done = run_command(command, cwd=directory, env=env, timeout_s=RUN_TIMEOUT_S)
    if done.timed_out:
        raise SystemExit(f"{' '.join(command)} did not finish within {RUN_TIMEOUT_S:.0f} s")
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr}")
    return done.wall_s


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=2000, help="tests in the suite (2000)")
    parser.add_argument("--churners", type=int, default=300, help="churning processes (300)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode, alternating (3)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.tests < 1 or args.rounds < 1 or args.churners < 0:
        parser.error("--tests and --rounds must be >= 1, --churners >= 0")
    result = measure(args.tests, args.churners, args.rounds)
    return report(result, args.json)


if __name__ == "__main__":
    main()
