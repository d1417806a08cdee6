"""``/proc/PID/stat`` read as a :class:`TreeProcess` (re-exported by ``helpers.tree``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TreeProcess", "read_stat"]

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
