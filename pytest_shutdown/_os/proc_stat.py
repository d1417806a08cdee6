"""The one reader of ``/proc/PID/stat``: its fields (:func:`stat_fields`), whether a process
still runs (:func:`process_running`) or is on its way out (:func:`process_ending`), and the
whole line as a :class:`TreeProcess` (re-exported by ``helpers.tree``)."""

from __future__ import annotations

import os

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass

__all__ = ["TreeProcess", "process_ending", "process_running", "read_stat", "stat_fields"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_ENDED = ("Z", "X", "x")
_PSUTIL_ENDED = ("zombie", "dead")
#: ``PF_EXITING`` in the flags (field 9): the process runs its exit (a big one takes a while).
_PF_EXITING = 0x4
#: SIGKILL in the thread's pending signals (field 31): a fatal signal was sent to the process;
#: the kernel marks it so in the sender's ``kill()``, before the process runs again.
_SIGKILL_PENDING = 1 << (9 - 1)


def _stat_text(pid: int) -> str | None:
    """``/proc/PID/stat``; None when ``pid`` is gone. Raises OSError when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return None


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first, then the
    ppid ...); None when ``pid`` is gone. Raises OSError when it exists but cannot be read."""
    data = _stat_text(pid)
    return None if data is None else data[data.rfind(")") + 2 :].split()


def process_ending(pid: int) -> bool:
    """True when ``pid`` is gone, a zombie, or already on its way out: a fatal signal sent to
    it is pending, or it runs its exit. False where ``/proc`` cannot tell."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return False
    if fields is None:
        return os.path.exists("/proc/self/stat")
    if fields[0] in _ENDED:
        return True
    try:
        return bool(int(fields[6]) & _PF_EXITING or int(fields[28]) & _SIGKILL_PENDING)
    except (IndexError, ValueError):
        return False


def process_running(pid: int) -> bool:
    """True while the process ``pid`` runs (a zombie has ended). Read from ``/proc/PID/stat``:
    importing psutil would cost several milliseconds; psutil where there is no ``/proc``."""
    try:
        fields = stat_fields(pid)
        if fields is None and os.path.exists("/proc/self/stat"):
            return False  # gone (reaped)
    except OSError:
        fields = None
    if fields:
        return fields[0] not in _ENDED
    import psutil  # noqa: PLC0415 - no /proc here

    try:
        return psutil.Process(pid).status() not in _PSUTIL_ENDED
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # pragma: no cover - access denied: it exists
        return True


@lazy_dataclass(frozen=True)
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
        data = _stat_text(pid)
    except OSError:
        return None
    if data is None:
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
