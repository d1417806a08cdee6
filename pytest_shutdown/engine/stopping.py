"""Stopping processes: ``shutdown_processes``, ``kill_process_tree`` and ``ShutdownOutcome``.

Every level of the reference tree stops its children with it, so it imports nothing of the
engine (nor torch).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from operator import methodcaller

from pytest_shutdown._os.killer import kill_trees

logger = logging.getLogger("pytest_shutdown.engine")

KILL_WAIT_S = 5.0
JOIN_POLL_S = 0.1


@dataclass(frozen=True)
class ShutdownOutcome:
    """What ``shutdown_processes`` did: the timeout it used, exit codes, who was force-killed."""

    timeout: float
    exitcodes: dict[str, int | None]
    force_killed: list[str]
    duration_s: float

    @property
    def any_force_killed(self) -> bool:
        return bool(self.force_killed)


def validate_timeout(value: object, option: str = "timeout") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{option}: expected None or a number >= 0, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{option}: expected None or a finite number >= 0, got {value!r}")
    return float(value)


def close_quietly(conn: Connection | None) -> None:
    """Close ``conn`` (None: nothing to close), ignoring an error: it is let go either way."""
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass


def kill_process_tree(pid: int, *, timeout: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL ``pid`` and all its descendants; wait up to ``timeout``; return the pids killed.

    Descendants are listed before anything is killed, so the ones re-parented by the kill are
    not missed. A zombie counts as gone.
    """
    records = kill_trees([pid], why="the reference engine's force kill", timeout=timeout)
    return [r["pid"] for r in records]


def shutdown_processes(
    procs: Sequence[BaseProcess],
    timeout: float | None,
    *,
    default_timeout: float = 5.0,
    terminate: Callable[[BaseProcess], None] | None = None,
) -> ShutdownOutcome:
    """Stop ``procs``: SIGTERM to all, one shared deadline (never one per process), then kill
    the survivors' trees with one warning. Returns what it did.

    ``timeout`` None means ``default_timeout``. ``terminate`` replaces ``proc.terminate()`` as the
    first step. Processes that were never started are left alone.
    """
    timeout_used = validate_timeout(timeout)
    if timeout_used is None:
        timeout_used = validate_timeout(default_timeout, "default_timeout") or 0.0
    started = time.monotonic()
    deadline = started + timeout_used
    live = [p for p in procs if p.pid is not None]
    for proc in live:
        if proc.is_alive():
            try:
                (terminate or methodcaller("terminate"))(proc)
            except (ProcessLookupError, OSError):
                pass
    for proc in live:
        _join_polling(proc, deadline)
    survivors = [p for p in live if p.is_alive()]
    if survivors:
        logger.warning("force killing remaining processes count=%d", len(survivors))
        for proc in survivors:
            assert proc.pid is not None
            kill_process_tree(proc.pid)
        for proc in survivors:
            proc.join(KILL_WAIT_S)
    names = _unique_names(procs)
    return ShutdownOutcome(
        timeout=timeout_used,
        exitcodes={names[i]: p.exitcode for i, p in enumerate(procs) if p.pid is not None},
        force_killed=[names[i] for i, p in enumerate(procs) if p in survivors],
        duration_s=time.monotonic() - started,
    )


def _join_polling(proc: BaseProcess, deadline: float) -> None:
    """A process's sentinel stays unreadable while a fork of it (an orphaned child) holds the
    write end: the exit status is polled too."""
    while proc.exitcode is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        proc.join(min(remaining, JOIN_POLL_S))


def _unique_names(procs: Sequence[BaseProcess]) -> list[str]:
    counts: dict[str, int] = {}
    for p in procs:
        counts[p.name] = counts.get(p.name, 0) + 1
    return [p.name if counts[p.name] == 1 else f"{p.name}[pid={p.pid}]" for p in procs]
