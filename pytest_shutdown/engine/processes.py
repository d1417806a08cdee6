"""The EngineCore process manager (``shutdown_processes`` and co. are re-exported from
``engine/stopping.py``)."""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCoreOutput
from pytest_shutdown.engine.core_proc import (
    MSG_ABORT,
    MSG_ADD,
    MSG_ENGINE_DEAD,
    MSG_OUTPUTS,
    MSG_READY,
    MSG_RING,
    MSG_STARTUP_FAILED,
    MSG_UTILITY,
    MSG_UTILITY_RESULT,
    ChildFaults,
    engine_process_main,
)
from pytest_shutdown.engine.dp_group import DPGroupSpec, dp_group_spec
from pytest_shutdown.engine.shm_ring import ShmRing, segment_name, unlink_segment
from pytest_shutdown.engine.start import engine_context, pdeathsig_safe, serialize_exit_polling
from pytest_shutdown.engine.stop_flag import SignalStop
from pytest_shutdown.engine.stopping import ShutdownOutcome as ShutdownOutcome  # re-exported
from pytest_shutdown.engine.stopping import close_quietly, shutdown_processes, validate_timeout
from pytest_shutdown.engine.stopping import kill_process_tree as kill_process_tree  # re-exported
from pytest_shutdown.engine.timeouts import get_engine_process_shutdown_timeout

logger = logging.getLogger("pytest_shutdown.engine")

MONITOR_POLL_S = 1.0
STARTUP_POLL_S = 0.05


class EngineStartupError(RuntimeError):
    """An engine process failed while starting; the message carries the child's traceback."""


class StartupInterrupted(EngineStartupError):
    """The caller's ``interrupt`` event was set while the engine processes were starting."""


@dataclass(frozen=True)
class ProcessFailure:
    """An engine process that died (or reported its engine dead) while the manager was running."""

    name: str
    pid: int | None
    exitcode: int | None
    detail: str = ""


@dataclass
class _Shared:
    """What the manager shares with its monitor thread and finalizer (never the manager)."""

    config: EngineConfig
    processes: list[BaseProcess] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    send_locks: list[threading.Lock] = field(default_factory=list)
    manager_stopped: threading.Event = field(default_factory=threading.Event)
    outputs: queue.Queue[EngineCoreOutput] = field(default_factory=queue.Queue)
    utility_calls: dict[int, Future[Any]] = field(default_factory=dict)
    failures: list[ProcessFailure] = field(default_factory=list)
    shut_down: threading.Event = field(default_factory=threading.Event)
    ring_names: list[str] = field(default_factory=list)
    rings: dict[int, ShmRing] = field(default_factory=dict)
    #: False only for the #51579 regression.
    unlink_rings: bool = True
    ring_lock: threading.Lock = field(default_factory=threading.Lock)

    def attach_ring(self, index: int) -> None:
        try:
            self.rings[index] = ShmRing.attach(self.ring_names[index])
        except (OSError, ValueError):  # gone already: the child died right after its ready
            pass

    def drain_ring(self, index: int) -> None:
        with self.ring_lock:  # one reader at a time (the monitor, a shutdown, the finalizer)
            ring = self.rings.get(index)
            batches = ring.get_all() if ring is not None else []
        for outputs in batches:
            for output in outputs:
                self.outputs.put(output)

    def close_connections(self) -> None:
        for index in list(self.rings):
            self.drain_ring(index)
            with self.ring_lock:
                ring = self.rings.pop(index, None)
            if ring is not None:
                ring.close()
        if self.unlink_rings:  # the child unlinks its own on a clean exit; not after a SIGKILL
            for name in self.ring_names:
                unlink_segment(name)
        for conn in self.connections:
            conn.close()
        for call_id in list(self.utility_calls):
            future = self.utility_calls.pop(call_id, None)
            if future is not None and not future.done():
                future.set_exception(RuntimeError("EngineProcManager is shut down"))


def _reap_on_gc(shared: _Shared, wake_w: Connection, timeout: float | None) -> ShutdownOutcome:
    """The GC fallback, and the reaping of a failed start."""
    shared.manager_stopped.set()
    close_quietly(wake_w)
    outcome = shutdown_processes(
        shared.processes, timeout, default_timeout=shared.config.default_process_timeout_s
    )
    shared.close_connections()
    shared.shut_down.set()
    return outcome


class EngineProcManager:
    """Starts ``data_parallel_size`` EngineCore processes ``EngineCore_DP{i}`` and stops them.

    The constructor returns once every process reported ready (deadline
    ``config.startup_timeout_s``); if a start fails, the ones already started are reaped and the
    error propagates. ``shutdown(timeout)`` is idempotent; ``last_outcome`` keeps what it did. A
    process that dies while the manager runs is recorded in ``failures`` and the others are shut
    down.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        lifecycle_log: str | None = None,
        faults: ChildFaults | None = None,
        interrupt: threading.Event | SignalStop | None = None,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        self._shared = _Shared(
            self.config, unlink_rings=faults is None or faults.parent_unlinks_ring
        )
        self.processes = self._shared.processes
        self.manager_stopped = self._shared.manager_stopped
        self.outputs = self._shared.outputs
        self.failures = self._shared.failures
        self.last_outcome: ShutdownOutcome | None = None
        self._request_shutdown_timeout = self.config.shutdown_timeout
        self._platform = self.config.resolved_platform
        self._shutdown_lock = threading.Lock()
        self._call_ids = itertools.count()
        self._next_rank = itertools.cycle(range(self.config.data_parallel_size))
        self._wake_r, self._wake_w = mp_connection.Pipe(duplex=False)
        gc_timeout = get_engine_process_shutdown_timeout(
            self._request_shutdown_timeout, None, self._platform,
            rocm_grace_s=self.config.rocm_process_grace_s,
        )
        # Registered before the first start, so a process is never unowned.
        self._finalizer = weakref.finalize(
            self, _reap_on_gc, self._shared, self._wake_w, gc_timeout
        )
        self._monitor: threading.Thread | None = None
        self.dp_group: DPGroupSpec | None = None
        try:
            self._start_processes(lifecycle_log, faults, interrupt)
        except BaseException:
            self._finalizer.detach()
            self.last_outcome = _reap_on_gc(self._shared, self._wake_w, None)
            close_quietly(self._wake_r)
            raise
        self._monitor = threading.Thread(
            target=_monitor_loop,
            args=(self._shared, self._wake_r, weakref.ref(self)),
            name="engine-proc-monitor",
            daemon=True,
        )
        self._monitor.start()

    def _start_processes(
        self,
        lifecycle_log: str | None,
        faults: ChildFaults | None,
        interrupt: threading.Event | SignalStop | None,
    ) -> None:
        ctx = engine_context(self.config)
        pdeathsig = pdeathsig_safe(self.config.start_method)
        deadline = time.monotonic() + self.config.startup_timeout_s
        dp_group = self.dp_group = dp_group_spec(self.config)
        for rank in range(self.config.data_parallel_size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            ring_name = segment_name(f"ec{rank}")
            self._shared.ring_names.append(ring_name)
            self._shared.connections.append(parent_conn)
            self._shared.send_locks.append(threading.Lock())
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=engine_process_main,
                name=f"EngineCore_DP{rank}",
                args=(
                    self.config, child_conn, rank, os.getpid(), lifecycle_log, faults, pdeathsig,
                    ring_name, dp_group,
                ),
                daemon=True,
            )
            self.processes.append(proc)
            try:
                proc.start()
                serialize_exit_polling(proc)
            finally:
                child_conn.close()
        for proc, conn in zip(self.processes, self._shared.connections, strict=True):
            self._wait_ready(proc, conn, deadline, interrupt)

    def _wait_ready(
        self,
        proc: BaseProcess,
        conn: Connection,
        deadline: float,
        interrupt: threading.Event | SignalStop | None,
    ) -> None:
        others = {p.sentinel: p for p in self.processes if p is not proc}
        while True:
            if interrupt is not None and interrupt.is_set():
                raise StartupInterrupted(f"start-up interrupted while waiting for {proc.name}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{proc.name} was not ready within EngineConfig.startup_timeout_s="
                    f"{self.config.startup_timeout_s} s; raise startup_timeout_s on a slow machine"
                )
            poll = remaining if interrupt is None else min(remaining, STARTUP_POLL_S)
            ready = mp_connection.wait([conn, proc.sentinel, *others], timeout=poll)
            dead = [others[s] for s in ready if s in others]
            if dead:
                raise self._died_during_startup(dead[0])
            if conn in ready:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    raise self._died_during_startup(proc) from None
                if msg[0] == MSG_READY:
                    self._shared.attach_ring(self.processes.index(proc))
                    return
                if msg[0] == MSG_STARTUP_FAILED:
                    raise EngineStartupError(f"{proc.name} failed to start:\n{msg[1]}")
            elif proc.sentinel in ready:
                raise self._died_during_startup(proc)

    def _died_during_startup(self, proc: BaseProcess) -> EngineStartupError:
        """The error it reported before it exited (the original error), else its exit code."""
        proc.join(1.0)
        conns = dict(zip(self.processes, self._shared.connections, strict=True))
        conn = conns.get(proc)
        try:
            while conn is not None and conn.poll():
                msg = conn.recv()
                if msg[0] == MSG_STARTUP_FAILED:
                    return EngineStartupError(f"{proc.name} failed to start:\n{msg[1]}")
        except (EOFError, OSError):
            pass
        return EngineStartupError(f"{proc.name} exited during startup (exit code {proc.exitcode})")

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int = 16,
        *,
        rank: int | None = None,
    ) -> int:
        """Send a request to engine ``rank`` (round robin when None); returns the rank."""
        rank = next(self._next_rank) if rank is None else rank
        self._send(rank, (MSG_ADD, request_id, list(prompt_token_ids), max_tokens))
        return rank

    def abort_requests(self, request_ids: Iterable[str] | None = None) -> None:
        """Abort the given requests (all when None) on every engine."""
        ids = None if request_ids is None else list(request_ids)
        for rank in range(len(self.processes)):
            self._send(rank, (MSG_ABORT, ids))

    def call_utility(self, name: str, *args: Any, rank: int = 0, timeout: float = 10.0) -> Any:
        """Call ``EngineCore.utility(name, *args)`` in engine ``rank`` and wait for the answer."""
        call_id = next(self._call_ids)
        future: Future[Any] = Future()
        self._shared.utility_calls[call_id] = future
        self._send(rank, (MSG_UTILITY, call_id, name, tuple(args)))
        return future.result(timeout)

    def _send(self, rank: int, msg: tuple[Any, ...]) -> None:
        if not 0 <= rank < len(self.processes):
            raise ValueError(f"rank: expected 0..{len(self.processes) - 1}, got {rank!r}")
        if self.manager_stopped.is_set():
            raise RuntimeError("EngineProcManager is shut down")
        with self._shared.send_locks[rank]:
            self._shared.connections[rank].send(msg)

    def shutdown(self, timeout: float | None = None) -> ShutdownOutcome | None:
        """Stop the engine processes; idempotent; returns (and keeps) the outcome.

        The timeout used is ``get_engine_process_shutdown_timeout`` of ``timeout`` (the ROCm
        grace on 0/0).
        """
        timeout = validate_timeout(timeout)
        self.manager_stopped.set()
        with self._shutdown_lock:
            if self._finalizer.detach() is not None:
                process_timeout = get_engine_process_shutdown_timeout(
                    self._request_shutdown_timeout, timeout, self._platform,
                    rocm_grace_s=self.config.rocm_process_grace_s,
                )
                if process_timeout != timeout:
                    logger.info(
                        "[shutdown] EngineCore process manager: using %ss ROCm cleanup grace "
                        "after immediate request abort", process_timeout,
                    )
                close_quietly(self._wake_w)
                self.last_outcome = shutdown_processes(
                    self.processes, process_timeout,
                    default_timeout=self.config.default_process_timeout_s,
                )
                monitor = self._monitor
                if monitor is not None and monitor is not threading.current_thread():
                    monitor.join(MONITOR_POLL_S + 1.0)
                self._shared.close_connections()
                close_quietly(self._wake_r)
                self._shared.shut_down.set()
        return self.last_outcome

    @property
    def is_shut_down(self) -> bool:
        """Whether a shutdown has finished (False while one still runs)."""
        return self._shared.shut_down.is_set()

    def __enter__(self) -> EngineProcManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _monitor_loop(
    shared: _Shared, wake_r: Connection, manager_ref: weakref.ReferenceType[EngineProcManager]
) -> None:
    try:
        _monitor(shared, wake_r, manager_ref)
    finally:
        close_quietly(wake_r)


def _monitor(
    shared: _Shared, wake_r: Connection, manager_ref: weakref.ReferenceType[EngineProcManager]
) -> None:
    conns = list(shared.connections)
    sentinels = {p.sentinel: p for p in shared.processes}
    while not shared.manager_stopped.is_set():
        try:
            ready = mp_connection.wait([wake_r, *conns, *sentinels], timeout=MONITOR_POLL_S)
        except OSError:
            return
        if wake_r in ready or shared.manager_stopped.is_set():
            return
        for obj in ready:
            if isinstance(obj, Connection) and not _drain(shared, obj):
                conns.remove(obj)
        # A fork of the dead process (an orphaned worker) may hold the sentinel's write end.
        dead = [
            sentinels.pop(s) for s in list(sentinels)
            if s in ready or (not ready and sentinels[s].exitcode is not None)
        ]
        if dead and not shared.manager_stopped.is_set():
            for proc in dead:
                conn = shared.connections[shared.processes.index(proc)]
                if conn in conns:
                    _drain(shared, conn)  # the last outputs it sent before dying
                proc.join(1.0)
                failure = ProcessFailure(proc.name, proc.pid, proc.exitcode, "exited")
                shared.failures.append(failure)
                logger.error(
                    "[shutdown] %s (pid %s) died while the manager was running, exit code %s; "
                    "shutting the other engine processes down", proc.name, proc.pid, proc.exitcode,
                )
            manager = manager_ref()
            if manager is not None:
                manager.shutdown()
            return


def _drain(shared: _Shared, conn: Connection) -> bool:
    """False once ``conn`` is at EOF."""
    index = shared.connections.index(conn)
    proc = shared.processes[index]
    try:
        while conn.poll(0):
            msg = conn.recv()
            shared.drain_ring(index)  # what the ring holds was sent before this message
            _dispatch(shared, msg, proc)
    except (EOFError, OSError):
        return False
    return True


def _dispatch(shared: _Shared, msg: tuple[Any, ...], proc: BaseProcess) -> None:
    kind = msg[0]
    if kind == MSG_RING:
        return  # a wake-up: the ring was drained before dispatching
    if kind == MSG_OUTPUTS:
        for output in msg[1]:
            shared.outputs.put(output)
    elif kind == MSG_UTILITY_RESULT:
        _, call_id, ok, value = msg
        future = shared.utility_calls.pop(call_id, None)
        if future is not None and not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(f"{proc.name}: {value}"))
    elif kind == MSG_ENGINE_DEAD:
        shared.failures.append(ProcessFailure(proc.name, proc.pid, None, msg[1]))
        logger.error("[shutdown] %s reported its engine dead:\n%s", proc.name, msg[1])
