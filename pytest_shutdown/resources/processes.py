"""Processes: descendants of the pytest process a test started and left running
(``process-leak``), however they were re-parented (see :mod:`pytest_shutdown.containment`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.checks.leaks import (
    Started,
    await_exit,
    descendant_pids,
    kill_process_trees,
    leak_findings,
    multiprocessing_helper_pids,
    process_running,
)
from pytest_shutdown.resources.base import Allowance, ObjectKind

__all__ = ["ProcessKind", "parent_pids"]


class ProcessKind(ObjectKind):
    """Descendant processes by pid. A snapshot is one ``waitid`` system call while this process
    has no child, the last walk's answer while no pid was allocated on the host, else a walk
    down this process's children lists (O(its own descendants))."""

    name = "processes"
    allow_key = "processes"

    def snapshot(self) -> frozenset[int]:
        return descendant_pids()

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[int]:
        if allow is True:
            return ()
        now = descendant_pids()
        if not now or now <= before:
            return ()
        fresh = now - before - multiprocessing_helper_pids()
        return tuple(sorted(p for p in fresh if process_running(p)))

    def targets(self, items: Sequence[int]) -> Mapping[Any, object]:
        from pytest_shutdown.ownership import objects_of  # noqa: PLC0415

        return objects_of((), items, parent_pids(tuple(items)))

    def settle(self, items: Sequence[int], deadline: float) -> Sequence[int]:
        return await_exit(Started((), tuple(items)), deadline - time.monotonic()).pids

    def findings(
        self,
        items: Sequence[int],
        subject: str,
        *,
        grace: float,
        extra: Mapping[str, Any] | None = None,
    ) -> list:  # type: ignore[type-arg]
        return leak_findings(
            Started((), tuple(items)), grace=grace, subject=subject, extra=dict(extra or {})
        )

    def restore(self, items: Sequence[int]) -> None:
        if items:
            kill_process_trees(items, timeout=5.0)


def parent_pids(pids: tuple[int, ...]) -> dict[int, int]:
    """pid -> parent pid, for the processes and their ancestors (to reach a Process object)."""
    if not pids:
        return {}
    import psutil  # noqa: PLC0415 - only when a child process is alive

    parents: dict[int, int] = {}
    for pid in pids:
        current = pid
        for _ in range(16):
            try:
                parent = psutil.Process(current).ppid()
            except psutil.Error:
                break
            parents[current] = parent
            current = parent
            if parent in parents or parent <= 1:
                break
    return parents
