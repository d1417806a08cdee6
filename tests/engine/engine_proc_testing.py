"""Shared helpers for the process tests: fast configs, deadline waits, child-process targets.

The targets run in real child processes (started through the fork server), so they live in this
importable module rather than in a test module. Every target watches the process that started
it and exits within about a second of its death, so nothing outlives a killed pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import psutil

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core_proc import LifecycleLog
from pytest_shutdown.engine.lifeline import ParentWatch
from pytest_shutdown.engine.start import helper_process_pids

T = TypeVar("T")

#: The 15 s ROCm grace, scaled down: same decisions, seconds instead of minutes.
GRACE_S = 2.5
#: shutdown_processes' default timeout when the caller passes None, scaled down.
DEFAULT_TIMEOUT_S = 3.0


#: The platform tests run on unless they force one; scripts/gpu-check sets it to the real device.
TEST_PLATFORM = os.environ.get("PYTEST_SHUTDOWN_TEST_PLATFORM", "cpu")


def fast_config(**changes: Any) -> EngineConfig:
    """A small engine with scaled-down graces; ``changes`` override any field."""
    base: dict[str, Any] = dict(
        platform=TEST_PLATFORM,
        rocm_process_grace_s=GRACE_S,
        child_exit_grace_s=1.0,
        default_process_timeout_s=DEFAULT_TIMEOUT_S,
        kv_cache_bytes=1 << 16,
        renderer_num_workers=1,
        startup_timeout_s=60.0,
    )
    base.update(changes)
    return EngineConfig(**base)


def wait_for(predicate: Callable[[], T], timeout: float, what: str, poll: float = 0.02) -> T:
    """Poll ``predicate`` until it is truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def events(path: str, name: str | None = None, pid: int | None = None) -> list[dict[str, Any]]:
    """The lifecycle events in ``path``, filtered by event name and pid."""
    return [
        e
        for e in LifecycleLog.read(path)
        if (name is None or e["event"] == name) and (pid is None or e["pid"] == pid)
    ]


def wait_event(path: str, name: str, pid: int | None = None, timeout: float = 10.0) -> dict:
    return wait_for(lambda: events(path, name, pid), timeout, f"event {name!r}")[-1]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def assert_gone(pids: Iterable[int], timeout: float = 5.0, what: str = "processes") -> None:
    pids = list(pids)
    wait_for(
        lambda: not [p for p in pids if alive(p)],
        timeout,
        f"{what} {[p for p in pids if alive(p)]} to exit",
    )


def descendants() -> list[psutil.Process]:
    """This process's live descendants, without its fork server and resource tracker."""
    helpers = helper_process_pids()
    out = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in helpers:
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


# -- child-process targets --------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    ParentWatch(parent_pid, lambda: None, exit_after_s=0.0).start()


def sleeper(parent_pid: int, conn: Connection) -> None:
    """Default SIGTERM handling: dies at once on SIGTERM."""
    _watch_parent(parent_pid)
    conn.send(("ready", None))
    time.sleep(60)


def stubborn(parent_pid: int, conn: Connection, with_grandchild: bool) -> None:
    """Ignores SIGTERM (only SIGKILL ends it); optionally owns a grandchild process."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _watch_parent(parent_pid)
    grandchild = None
    if with_grandchild:
        code = "import os,time\np=os.getppid()\nwhile os.getppid()==p: time.sleep(0.1)\n"
        grandchild = subprocess.Popen([sys.executable, "-c", code]).pid
    conn.send(("ready", grandchild))
    time.sleep(60)


def engine_owner(parent_pid: int, conn: Connection, config: EngineConfig) -> None:
    """Owns an EngineProcManager and reports its engine pids and its helper pids."""
    from pytest_shutdown.engine.processes import EngineProcManager  # noqa: PLC0415

    _watch_parent(parent_pid)
    manager = EngineProcManager(config)
    conn.send(([p.pid for p in manager.processes], sorted(helper_process_pids())))
    time.sleep(60)
    manager.shutdown()


def own_pid_and_parent() -> tuple[int, int]:
    return os.getpid(), os.getppid()
