"""Running a pytest session for a benchmark: one deadline, nothing left behind, the load noted.

Every benchmark run is a child in a session of its own (``start_new_session``), so that a run
that passes its deadline is ended with its whole process group (pool workers included), not just
the pytest process. Nothing here is a test: a failed or timed-out run is data for the report.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Run", "bytecode_env", "group_members", "load_average", "run_command"]

#: How long the processes of a finished run's group may take to end on their own.
LEFT_BEHIND_GRACE_S = 3.0


@dataclass(frozen=True)
class Run:
    """One finished (or ended) run: wall time, exit status, output."""

    wall_s: float
    #: CPU time (user + system) of the run and every descendant it reaped: less moved by the
    #: load of a shared machine than the wall time.
    cpu_s: float
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    #: Processes of the run's group were still alive after pytest exited (then killed).
    left_behind: bool = False


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as printed beside every figure."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not Unix
        return "unknown"


def bytecode_env(pycache: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every guard benchmark run: bytecode caching on, into ``pycache``,
    whatever ``PYTHONDONTWRITEBYTECODE`` says, so that neither mode pays for compiling modules
    from source (an installed plugin ships its bytecode or writes it on first use)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def run_command(
    command: Sequence[str], *, cwd: str | Path, env: dict[str, str], timeout_s: float
) -> Run:
    """Run ``command``; past ``timeout_s`` its whole process group is SIGKILLed and reaped."""
    before = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a pipe held by an escapee
            stdout, stderr = "", ""
    finally:
        if proc.poll() is None:  # interrupted (KeyboardInterrupt): leave nothing behind
            _kill_group(proc.pid)
            proc.wait(timeout=30)
    wall = time.perf_counter() - start
    cpu = _children_cpu_s() - before
    # A run that ended but left its group behind (an orphaned pool worker): end those too,
    # after a short grace for helpers that end on their own when pytest's pipes close (the
    # multiprocessing resource tracker).
    grace_end = time.monotonic() + LEFT_BEHIND_GRACE_S
    while not timed_out and _group_alive(proc.pid) and time.monotonic() < grace_end:
        time.sleep(0.05)
    left_behind = not timed_out and _group_alive(proc.pid)
    _kill_group(proc.pid)
    return Run(wall, cpu, proc.returncode, stdout or "", stderr or "", timed_out, left_behind)


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies, already ended, are not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
