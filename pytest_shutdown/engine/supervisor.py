"""DPSupervisor: a data-parallel supervisor over engine-owning children (vLLM's shape).

This process -> ``num_children`` children, each in its own process group running an
``EngineProcManager`` with its EngineCore processes.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
import weakref
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pytest_shutdown.engine.config import START_METHODS, EngineConfig
from pytest_shutdown.engine.faults import ChildFaults
from pytest_shutdown.engine.lifecycle import LifecycleLog
from pytest_shutdown.engine.lifeline import (
    ParentWatch,
    on_stop_signals,
    set_parent_death_signal,
    wake_fd,
)
from pytest_shutdown.engine.processes import (
    EngineProcManager,
    ShutdownOutcome,
    kill_process_tree,
    shutdown_processes,
    validate_timeout,
)
from pytest_shutdown.engine.start import engine_context, pdeathsig_safe, serialize_exit_polling
from pytest_shutdown.engine.timeouts import get_engine_process_shutdown_timeout

logger = logging.getLogger("pytest_shutdown.engine")


class DPSupervisor:
    """Starts ``num_children`` supervised children, each owning an ``EngineProcManager``.

    The children start with ``config.start_method``, their engines with ``engine_start_method``
    (default: the same). The constructor returns once all are ready (deadline
    ``config.startup_timeout_s``). ``engine_pids``: each child's pid → its engine pids.
    ``shutdown(timeout)`` forwards the signal to every child's process group, waits
    ``get_engine_process_shutdown_timeout(t, t) + child_exit_grace_s`` in total, then kills the
    survivors' trees: a child that drains within its budget is never force-killed.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        num_children: int = 2,
        engine_start_method: str | None = None,
        lifecycle_log: str | None = None,
        faults: ChildFaults | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        if isinstance(num_children, bool) or not isinstance(num_children, int) or num_children < 1:
            raise ValueError(f"num_children: expected a positive integer, got {num_children!r}")
        if engine_start_method is not None and engine_start_method not in START_METHODS:
            raise ValueError(
                f"engine_start_method: unknown value {engine_start_method!r}; "
                f"accepted: {', '.join(START_METHODS)}"
            )
        self._platform = self.config.resolved_platform
        child_config = self.config.replace(
            platform=self._platform,
            start_method=engine_start_method or self.config.start_method,
        )
        self.children: list[BaseProcess] = []
        self.engine_pids: dict[int, list[int]] = {}
        self.last_outcome: ShutdownOutcome | None = None
        self._pgids: dict[int, int] = {}
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(
            self, _shutdown_children, self.children, self._pgids, self.shutdown_budget(),
            signal.SIGTERM,
        )
        ctx = engine_context(self.config)
        pdeathsig = pdeathsig_safe(self.config.start_method)
        try:
            for index in range(num_children):
                parent_conn, child_conn = ctx.Pipe(duplex=False)
                self._conns.append(parent_conn)
                proc = ctx.Process(  # type: ignore[attr-defined]
                    target=supervised_child_main,
                    name=f"DPSupervisorChild_{index}",
                    args=(child_config, child_conn, os.getpid(), lifecycle_log, faults, pdeathsig),
                    daemon=False,  # it has children of its own
                )
                self.children.append(proc)
                try:
                    proc.start()
                    serialize_exit_polling(proc)
                finally:
                    child_conn.close()
            deadline = time.monotonic() + self.config.startup_timeout_s
            for proc, conn in zip(self.children, self._conns, strict=True):
                self._wait_ready(proc, conn, deadline)
        except BaseException:
            self._finalizer.detach()
            _kill_trees(self.children)
            self._close()
            raise

    def _wait_ready(self, proc: BaseProcess, conn: Connection, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        ready = mp_connection.wait([conn, proc.sentinel], timeout=max(0.0, remaining))
        if conn in ready:
            try:
                kind, pid, pgid, engine_pids = conn.recv()
            except (EOFError, OSError):
                kind = "died"
            if kind == "ready":
                self._pgids[pid] = pgid
                self.engine_pids[pid] = list(engine_pids)
                return
        if not ready:
            raise TimeoutError(
                f"{proc.name} was not ready within EngineConfig.startup_timeout_s="
                f"{self.config.startup_timeout_s} s"
            )
        proc.join(1.0)
        raise RuntimeError(f"{proc.name} failed to start (exit code {proc.exitcode})")

    def shutdown_budget(self, timeout: float | None = None) -> float:
        """``get_engine_process_shutdown_timeout(t, t) + child_exit_grace_s``; ``t`` is
        ``timeout`` or ``config.shutdown_timeout``, None counts as ``default_process_timeout_s``.
        """
        t = self.config.shutdown_timeout if timeout is None else validate_timeout(timeout)
        process_timeout = get_engine_process_shutdown_timeout(
            t, t, self._platform, rocm_grace_s=self.config.rocm_process_grace_s
        )
        if process_timeout is None:
            process_timeout = self.config.default_process_timeout_s
        return process_timeout + self.config.child_exit_grace_s

    def shutdown(
        self, timeout: float | None = None, *, signum: int = signal.SIGTERM
    ) -> ShutdownOutcome | None:
        """Forward ``signum`` to every child's group and wait the budget; idempotent."""
        if self._finalizer.detach() is not None:
            budget = self.shutdown_budget(timeout)
            self.last_outcome = _shutdown_children(self.children, self._pgids, budget, signum)
            self._close()
        return self.last_outcome

    def run_until_signal(self, timeout: float | None = None) -> ShutdownOutcome | None:
        """Serve until this process gets SIGTERM or SIGINT, then forward it and shut down.

        Call from the main thread. With a ``timeout`` and no signal by then, returns None and
        leaves the children running.
        """
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        received: list[int] = []

        def handler(signum: int, frame: Any) -> None:
            received.append(signum)
            wake_fd(wake_w)

        previous = on_stop_signals(handler)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not received:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                select.select([wake_r], [], [], 0.5 if remaining is None else min(0.5, remaining))
            return self.shutdown(signum=received[0])
        finally:
            for signum, old_handler in previous.items():
                signal.signal(signum, old_handler)
            os.close(wake_r)
            os.close(wake_w)

    def _close(self) -> None:
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> DPSupervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _forward_signal(proc: BaseProcess, pgids: dict[int, int], signum: int) -> None:
    assert proc.pid is not None
    pgid = pgids.get(proc.pid)
    try:
        if pgid is not None:
            os.killpg(pgid, signum)
        else:
            os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass


def _shutdown_children(
    children: list[BaseProcess], pgids: dict[int, int], budget: float, signum: int
) -> ShutdownOutcome:
    return shutdown_processes(
        children, budget, terminate=lambda p: _forward_signal(p, pgids, signum)
    )


def _kill_trees(children: list[BaseProcess]) -> None:
    for proc in children:
        if proc.pid is not None and proc.is_alive():
            kill_process_tree(proc.pid)
            proc.join(1.0)


def supervised_child_main(
    config: EngineConfig,
    conn: Connection,
    parent_pid: int,
    lifecycle_log: str | None,
    faults: ChildFaults | None,
    pdeathsig: bool,
) -> None:
    """A supervised child: own process group, one ``EngineProcManager``, stop on SIGTERM/SIGINT.

    Its ``engines_stopped`` lifecycle event is what its manager's shutdown saw: exit codes as this
    process read them, force-killed engines, engines its monitor took for dead before the stop.
    """
    os.setpgid(0, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        wake_fd(wake_w)

    on_stop_signals(handler)
    if pdeathsig:
        set_parent_death_signal(signal.SIGTERM)
    manager = EngineProcManager(config, lifecycle_log=lifecycle_log, faults=faults)
    # Started after the engines: a fork start method must not fork while this thread runs.
    watch = ParentWatch(parent_pid, lambda: wake_fd(wake_w), exit_after_s=1.0).start()
    try:
        conn.send(("ready", os.getpid(), os.getpgid(0), [p.pid for p in manager.processes]))
        while not received and not watch.parent_gone.is_set():
            select.select([wake_r], [], [], 0.5)
    finally:
        on_stop_signals(signal.SIG_IGN)
        timeout = 0.0 if watch.parent_gone.is_set() else config.shutdown_timeout
        outcome = manager.shutdown(timeout)
        if outcome is not None:
            LifecycleLog(lifecycle_log).event(
                "engines_stopped", exitcodes=outcome.exitcodes,
                force_killed=outcome.force_killed, duration_s=round(outcome.duration_s, 3),
                failures=[[f.name, f.exitcode] for f in manager.failures],
            )
        watch.stop()
        on_stop_signals(signal.SIG_DFL)
