"""The one tree killer: every process the project kills goes through :func:`kill_trees`, and
every end the session ordered is recorded with why (a death not recorded is a
``collateral-kill``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from pytest_shutdown._os.children import walk_descendants
from pytest_shutdown._os.proc_stat import process_running, stat_fields

__all__ = ["kill_trees", "ordered_end_of", "record_ordered_end", "tree_of"]

#: pid -> why its end was ordered (oldest dropped first).
_ORDERED: dict[int, str] = {}
_KEEP = 4096


def record_ordered_end(pids: Iterable[int], why: str) -> None:
    """Record that the ends of ``pids`` were ordered (``why``: by whom)."""
    for pid in pids:
        _ORDERED.pop(pid, None)
        _ORDERED[pid] = why
    while len(_ORDERED) > _KEEP:
        del _ORDERED[next(iter(_ORDERED))]


def ordered_end_of(pid: int) -> str | None:
    """Why the end of ``pid`` was ordered; None when nobody in the session ordered it."""
    return _ORDERED.get(pid)


def tree_of(pid: int) -> list[int]:
    """``pid`` and its descendants (parents first); empty when ``pid`` is gone. Walked down the
    children lists (:mod:`pytest_shutdown._os.children`); psutil, which reads the whole process
    table, only where the kernel keeps none."""
    walked = walk_descendants(pid)
    if walked is not None:
        try:
            return [pid, *walked] if stat_fields(pid) is not None else []
        except OSError:
            return [pid, *walked]
    import psutil  # noqa: PLC0415 - no children lists here

    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def kill_trees(
    pids: Iterable[int],
    *,
    why: str,
    timeout: float = 5.0,
    signum: int = signal.SIGKILL,
    describe: Callable[[int], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Send ``signum`` to each process of ``pids`` and its descendants (listed first, so that
    none a kill re-parents is missed), recording each end as ordered; wait up to ``timeout``.
    Nothing is reaped. Returns ``describe(pid)`` (or ``{"pid": pid}``) per process signalled."""
    victims: dict[int, None] = {}
    for pid in pids:
        victims.update(dict.fromkeys(tree_of(pid)))
    records: list[dict[str, Any]] = []
    record_ordered_end(victims, why)
    for pid in victims:
        record = describe(pid) if describe is not None else {"pid": pid}
        try:
            os.kill(pid, signum)
        except OSError:
            continue
        records.append(record)
    deadline = time.monotonic() + timeout
    remaining = list(victims)
    while remaining and time.monotonic() < deadline:
        remaining = [pid for pid in remaining if process_running(pid)]
        if remaining:
            time.sleep(0.01)
    return records
