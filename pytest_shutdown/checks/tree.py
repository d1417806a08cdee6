"""Finding every process of a tree under test, however it was re-parented (Linux ``/proc``).

A process belongs to the tree of a ``TreeLauncher`` when any of these holds:

* its environment carries the launcher's marker ``PYTEST_SHUTDOWN_TREE=<token>`` (inherited
  through fork and exec, kept across ``setsid`` and re-parenting);
* it descends from the launcher (a child subreaper: orphans are re-parented to it);
* it is in the session of a root the launcher started (``session``).

One pass over ``/proc`` reads each process's ``stat`` (parent, session, state, start time) and,
for a process not yet known, its ``environ``; results are cached per (pid, start time).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: Environment variable marking every process a launcher started (its value: the token).
TREE_MARKER_ENV = "PYTEST_SHUTDOWN_TREE"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class TreeProcess:
    """One process of the tree, as ``/proc`` showed it at the last scan."""

    pid: int
    name: str
    ppid: int
    session: int
    state: str
    start_ticks: int

    @property
    def key(self) -> tuple[int, int]:
        """(pid, start time): the same process, never a reuse of its pid."""
        return (self.pid, self.start_ticks)

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    def age_s(self) -> float | None:
        """Seconds since the process started."""
        try:
            with open("/proc/uptime", encoding="ascii") as f:
                uptime = float(f.read().split()[0])
        except OSError:
            return None
        return max(0.0, uptime - self.start_ticks / _CLOCK_TICKS)

    def cmdline(self) -> str:
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return ""


def read_stat(pid: int) -> TreeProcess | None:
    """``/proc/PID/stat`` of ``pid`` as a TreeProcess; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    lpar, rpar = data.find("("), data.rfind(")")
    fields = data[rpar + 2 :].split()
    try:
        return TreeProcess(
            pid=pid,
            name=data[lpar + 1 : rpar],
            state=fields[0],
            ppid=int(fields[1]),
            session=int(fields[3]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


_marker_cache: dict[tuple[int, int, str], bool] = {}


def _has_marker(proc: TreeProcess, marker: bytes, token: str) -> bool:
    key = (proc.pid, proc.start_ticks, token)
    known = _marker_cache.get(key)
    if known is not None:
        return known
    try:
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            found = marker in f.read()
    except OSError:
        return False  # gone, or not ours to read: not cached, it may become readable
    if len(_marker_cache) > 100_000:
        _marker_cache.clear()
    _marker_cache[key] = found
    return found


def all_pids() -> Iterable[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def scan_tree(
    token: str, launcher_pid: int, sessions: Iterable[int] = ()
) -> dict[int, TreeProcess]:
    """Every process of the launcher's tree now (the launcher itself left out), zombies too."""
    marker = f"{TREE_MARKER_ENV}={token}\0".encode()
    wanted_sessions = set(sessions)
    stats = {}
    for pid in all_pids():
        proc = read_stat(pid)
        if proc is not None:
            stats[pid] = proc
    children: dict[int, list[int]] = {}
    for proc in stats.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    members: dict[int, TreeProcess] = {}
    stack = list(children.get(launcher_pid, ()))
    while stack:
        pid = stack.pop()
        if pid in members or pid not in stats:
            continue
        members[pid] = stats[pid]
        stack.extend(children.get(pid, ()))
    own = os.getpid()
    for pid, proc in stats.items():
        if pid in members or pid in (launcher_pid, own):
            continue
        if proc.session in wanted_sessions or _has_marker(proc, marker, token):
            members[pid] = proc
    return members


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Poll until none of ``pids`` runs (a zombie has ended); the ones still running."""
    left = set(pids)
    deadline = time.monotonic() + timeout
    while left:
        left = {p for p in left if (s := read_stat(p)) is not None and s.alive}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return sorted(left)
