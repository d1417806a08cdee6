"""``Worker_TP{i}``: the tensor-parallel worker processes of one EngineCore (vLLM's topology).

With ``tensor_parallel_size`` > 1 an EngineCore forks that many workers (``spawn`` on ROCm)
before it starts any thread; each loads (``startup_delay_s``, interruptible), then holds its
KV-cache shard until told to stop. A worker's pipe is its death pipe: the EngineCore holds the
only other end (each new worker closes the ends of the earlier ones), so the EngineCore's death
is an EOF at once; ``getppid()`` changing is the backstop. SIGTERM/SIGINT end a worker with 0,
a gone parent with ``EXIT_PARENT_GONE``. ``WorkerGroup`` is the EngineCore's side.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from pytest_shutdown._os.phases import report_phase, wanted_phase
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.distributed import (
    CollectiveWatchdog,
    RankGroup,
    free_port,
    group_deadlines,
    host_store,
    select_backend,
)
from pytest_shutdown.engine.lifecycle import LifecycleLog
from pytest_shutdown.engine.lifeline import (
    EXIT_PARENT_GONE,
    on_stop_signals,
    set_parent_death_signal,
    set_process_name,
    wake_fd,
)
from pytest_shutdown.engine.start import serialize_exit_polling
from pytest_shutdown.engine.stopping import ShutdownOutcome, shutdown_processes

logger = logging.getLogger("pytest_shutdown.engine")

MSG_WORKER_READY = "worker_ready"  # (MSG_WORKER_READY, pid)
MSG_WORKER_STOP = "worker_stop"  # (MSG_WORKER_STOP,)
MSG_WORKER_STEP = "worker_step"  # (MSG_WORKER_STEP, step): run this step's collective
MSG_WORKER_STEP_DONE = "worker_step_done"  # (MSG_WORKER_STEP_DONE, step)
EXIT_PEER_GONE = 4
#: The phase a rank announces when it waits inside a collective for a straggling peer.
IN_COLLECTIVE = "in_collective"
#: A worker checks its parent at least this often (its pipe wakes it at once anyway).
WORKER_POLL_S = 0.1
#: How often the EngineCore's worker monitor polls exit statuses (sentinels wake it at once).
WATCH_POLL_S = 1.0
WORKER_STOP_TIMEOUT_S = 2.0


def worker_name(tp_rank: int) -> str:
    return f"Worker_TP{tp_rank}"


class WorkerStartupError(RuntimeError):
    """A worker exited or was not ready in time while its EngineCore was starting."""


def worker_process_main(
    config: EngineConfig,
    conn: Connection,
    tp_rank: int,
    dp_rank: int,
    parent_pid: int,
    inherited: list[Connection],
    lifecycle_log: str | None,
    lifeline: bool = True,
    lifeline_while_loading: bool = True,
    group: tuple[str, int] | None = None,
) -> None:
    """Target of every worker process; ``group``: ``(backend, store port)`` of its TP group."""
    for other in inherited:  # the EngineCore's ends of earlier workers' death pipes
        other.close()
    set_process_name(worker_name(tp_rank))
    log = LifecycleLog(lifecycle_log)
    log.event("worker_started", tp_rank=tp_rank, dp_rank=dp_rank)
    worker = _Worker(config, conn, tp_rank, parent_pid, lifeline, lifeline_while_loading)
    worker.group_spec = group
    worker.log = log
    code = worker.run()
    log.event("worker_exited", tp_rank=tp_rank, dp_rank=dp_rank, code=code)
    raise SystemExit(code)


class _Worker:
    def __init__(
        self,
        config: EngineConfig,
        conn: Connection,
        tp_rank: int,
        parent_pid: int,
        lifeline: bool,
        lifeline_while_loading: bool,
    ) -> None:
        self.config = config
        self.conn = conn
        self.tp_rank = tp_rank
        self.parent_pid = parent_pid
        self.lifeline = lifeline
        self.lifeline_while_loading = lifeline_while_loading
        self.signals: list[int] = []
        self.shard: Any = None
        self.group_spec: tuple[str, int] | None = None
        self.log: LifecycleLog = LifecycleLog(None)
        self.group: RankGroup | None = None
        self.watchdog: CollectiveWatchdog | None = None
        self.peer_gone = False
        self.step_due: tuple[int, float] | None = None
        self._reported_in_collective = False
        self._sig_fds: tuple[int, ...] = ()
        self._conn_open = True

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        on_stop_signals(self._on_signal)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        if self.lifeline and self.lifeline_while_loading:
            set_parent_death_signal(signal.SIGTERM)
        loaded_at = time.monotonic() + self.config.startup_delay_s
        try:
            while True:
                code = self._turn(wake_r, wake_w, loaded_at)
                if code is not None:
                    return code
        except BaseException:
            self.peer_gone = True  # an error of our own: no barrier the peers would wait in
            raise
        finally:
            on_stop_signals(signal.SIG_IGN)
            self._leave_group()
            self._release()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            # Left ignored: the process ends right after; the EngineCore's SIGTERM that follows
            # its stop message must not turn this clean exit into death by signal.

    def _turn(self, wake_r: int, wake_w: int, loaded_at: float) -> int | None:
        """The exit code when the worker is done, None to go on."""
        loading = self.shard is None
        watching = self.lifeline and (self.lifeline_while_loading or not loading)
        if self.signals:
            return 0
        if watching and os.getppid() != self.parent_pid:
            return self._parent_gone()
        now = time.monotonic()
        if loading and now >= loaded_at:
            return self._become_ready(wake_w)
        if self.step_due is not None and now >= self.step_due[1]:
            if not self._step(self.step_due[0]):
                return EXIT_PEER_GONE
            self.step_due = None
            return None
        return self._wait(wake_r, loading, watching, now, loaded_at)

    def _become_ready(self, wake_w: int) -> int | None:
        self._load()
        if self.group_spec is not None:
            if not self._join_group(wake_w):
                return EXIT_PEER_GONE
            if self.signals:
                return 0
        try:
            self.conn.send((MSG_WORKER_READY, os.getpid()))
        except OSError:
            self._conn_open = False
        return None

    def _wait(
        self, wake_r: int, loading: bool, watching: bool, now: float, loaded_at: float
    ) -> int | None:
        """The pipe is listened to only while a message can come or its EOF is the parent's
        death (watching)."""
        timeout = WORKER_POLL_S if not loading else min(WORKER_POLL_S, loaded_at - now)
        if self.step_due is not None:
            timeout = min(timeout, self.step_due[1] - now)
        waitables: list[Any] = [wake_r]
        if self._conn_open and (watching or not loading):
            waitables.append(self.conn)
        ready = mp_connection.wait(waitables, timeout=max(0.0, timeout))
        if wake_r in ready:
            os.read(wake_r, 64)
        if self.conn in ready:
            return self._receive(watching)
        return None

    def _receive(self, watching: bool) -> int | None:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            if watching:
                return self._parent_gone()
            self._conn_open = False  # no death pipe: the EOF goes unnoticed
            return None
        if msg[0] == MSG_WORKER_STOP:
            return 0
        if msg[0] == MSG_WORKER_STEP:
            last = self.tp_rank == self.config.tensor_parallel_size - 1
            straggle = self.config.collective_straggle_s if last else 0.0
            self.step_due = (msg[1], time.monotonic() + straggle)
        return None

    def _parent_gone(self) -> int:
        self.peer_gone = True  # the EngineCore is gone, and its ranks with it: no barrier
        return EXIT_PARENT_GONE

    def _join_group(self, wake_w: int) -> bool:
        """False when a peer failed the join. From here on the collective watchdog reads the
        signal wake-up fd and forwards it to ``wake_w``: a main thread blocked in a collective
        cannot."""
        assert self.group_spec is not None
        backend, port = self.group_spec
        config = self.config
        self.group = RankGroup(
            self.tp_rank, config.tensor_parallel_size, port, backend=backend,
            device=config.device, deadlines=group_deadlines(config),
        )
        sig_r, sig_w = os.pipe()
        os.set_blocking(sig_w, False)
        self._sig_fds = (sig_r, sig_w)
        signal.set_wakeup_fd(sig_w, warn_on_full_buffer=False)
        self.watchdog = CollectiveWatchdog(
            self.group, config.collective_abort_grace_s, self._exit_stuck,
            signal_fd=sig_r, on_signal=lambda data: wake_fd(wake_w, data),
            parent_pid=self.parent_pid if self.lifeline else None,
            parent_gone_code=EXIT_PARENT_GONE,
        )
        try:
            self.group.join()
        except RuntimeError as exc:  # a peer never came, or died while joining
            self.peer_gone = True
            self.log.event("group_join_failed", tp_rank=self.tp_rank, error=str(exc)[:500])
            return False
        self.log.event("group_joined", tp_rank=self.tp_rank, backend=backend)
        return True

    def _step(self, step: int) -> bool:
        assert self.group is not None
        if (
            self.config.collective_straggle_s
            and self.tp_rank == 0
            and not self._reported_in_collective
            and wanted_phase() == IN_COLLECTIVE
        ):
            self._reported_in_collective = True
            report_phase(IN_COLLECTIVE)
        try:
            self.group.step()
        except RuntimeError as exc:
            self.peer_gone = True
            self.log.event("collective_failed", tp_rank=self.tp_rank, error=str(exc)[:500])
            return False
        try:
            self.conn.send((MSG_WORKER_STEP_DONE, step))
        except OSError:
            pass
        return True

    def _leave_group(self) -> None:
        if self.group is None:
            return
        try:
            ending = self.group.shutdown(peer_gone=self.peer_gone)
        except Exception as exc:  # noqa: BLE001 - the exit must go on
            ending = f"failed: {exc}"
        self.log.event("group_left", tp_rank=self.tp_rank, ending=ending)
        if self.watchdog is not None:
            self.watchdog.close()
        signal.set_wakeup_fd(-1)
        for fd in self._sig_fds:
            os.close(fd)

    def _exit_stuck(self, code: int) -> None:
        self.log.event("collective_abandoned", tp_rank=self.tp_rank, code=code)
        os._exit(code)

    def _load(self) -> None:
        import torch  # noqa: PLC0415

        size = max(1, self.config.kv_cache_bytes // 4 // self.config.tensor_parallel_size)
        self.shard = torch.zeros(size, dtype=torch.float32, device=self.config.device)

    def _release(self) -> None:
        if self.shard is None:
            return
        device_type = self.shard.device.type
        self.shard = None
        if device_type == "cuda":
            import torch  # noqa: PLC0415

            torch.cuda.empty_cache()


class WorkerGroup:
    """The EngineCore's side of its workers; build it before any other thread starts (forks)."""

    def __init__(
        self,
        config: EngineConfig,
        dp_rank: int,
        lifecycle_log: str | None = None,
        *,
        lifeline: bool = True,
        lifeline_while_loading: bool = True,
    ) -> None:
        self.config = config
        self.store: Any = None
        self._step = 0
        self._outstanding = 0
        group: tuple[str, int] | None = None
        if config.process_group != "off":
            device_type = config.device.split(":")[0]
            group = (select_backend(config.process_group, device_type), free_port())
            import torch.distributed  # noqa: F401, PLC0415 - before the forks: workers start warm
        self.group = group
        method = "spawn" if config.resolved_platform == "rocm" else "fork"
        ctx = multiprocessing.get_context(method)
        self.processes: list[BaseProcess] = []
        self.connections: list[Connection] = []
        self._stop_r, self._stop_w = os.pipe()
        self._monitor: threading.Thread | None = None
        for tp_rank in range(config.tensor_parallel_size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            inherited = list(self.connections) if method == "fork" else []
            proc = ctx.Process(  # type: ignore[attr-defined]
                target=worker_process_main,
                name=worker_name(tp_rank),
                args=(
                    config, child_conn, tp_rank, dp_rank, os.getpid(), inherited,
                    lifecycle_log, lifeline, lifeline_while_loading, group,
                ),
                daemon=True,
            )
            self.connections.append(parent_conn)
            self.processes.append(proc)
            try:
                _start_from_daemon(proc)
                serialize_exit_polling(proc)
            finally:
                child_conn.close()
            if not lifeline:
                # The bug put back: workers whose only owner is the EngineCore's graceful path
                # (started by an executor of its own), unknown to multiprocessing's exit cleanup.
                multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]
        if group is not None:
            # After the forks: a worker must not inherit the listening socket or its thread.
            self.store = host_store(group[1], config.tensor_parallel_size, group_deadlines(config))

    def step(self) -> None:
        """Start the next step's collective on every worker unless one is still running."""
        if self.group is None:
            return
        for conn in self.connections:
            try:
                while self._outstanding and conn.poll(0):
                    if conn.recv()[0] == MSG_WORKER_STEP_DONE:
                        self._outstanding -= 1
            except (EOFError, OSError):
                pass  # a dead worker: the monitor reports it
        if self._outstanding:
            return
        self._step += 1
        for conn in self.connections:
            try:
                conn.send((MSG_WORKER_STEP, self._step))
            except OSError:
                pass
        self._outstanding = len(self.connections)

    def wait_ready(self, deadline: float, interrupted: Callable[[], bool]) -> bool:
        """False when ``interrupted()`` turned true first; raises ``WorkerStartupError``."""
        pending = dict(zip(self.connections, self.processes, strict=True))
        while pending:
            if interrupted():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = ", ".join(p.name for p in pending.values())
                raise WorkerStartupError(
                    f"{names} not ready within EngineConfig.startup_timeout_s="
                    f"{self.config.startup_timeout_s} s"
                )
            sentinels = {p.sentinel: p for p in pending.values()}
            ready = mp_connection.wait(
                [*pending, *sentinels], timeout=min(WORKER_POLL_S, remaining)
            )
            for obj in ready:
                if isinstance(obj, Connection) and obj in pending:
                    try:
                        msg = obj.recv()
                    except (EOFError, OSError):
                        self._startup_death(pending[obj])
                    if msg[0] == MSG_WORKER_READY:
                        del pending[obj]
                elif obj in sentinels and sentinels[obj] in pending.values():
                    self._startup_death(sentinels[obj])
        return True

    def wait_ready_untimed(self) -> None:
        """The bug of vLLM PR #44751 put back: block on each ready, no deadline, deaf to all."""
        for conn in self.connections:
            conn.recv()

    def _startup_death(self, proc: BaseProcess) -> NoReturn:
        proc.join(1.0)
        raise WorkerStartupError(f"{proc.name} exited during startup (exit code {proc.exitcode})")

    def watch(self, on_death: Callable[[str, int | None, int | None], None]) -> None:
        self._monitor = threading.Thread(
            target=self._watch, args=(on_death,), name="worker-monitor", daemon=True
        )
        self._monitor.start()

    def _watch(self, on_death: Callable[[str, int | None, int | None], None]) -> None:
        sentinels = {p.sentinel: p for p in self.processes}
        while True:
            ready = mp_connection.wait([self._stop_r, *sentinels], timeout=WATCH_POLL_S)
            if self._stop_r in ready:
                return
            dead = [p for s, p in sentinels.items() if s in ready or p.exitcode is not None]
            if dead:
                dead[0].join(1.0)
                on_death(dead[0].name, dead[0].pid, dead[0].exitcode)
                return

    def shutdown(self, timeout: float = WORKER_STOP_TIMEOUT_S) -> ShutdownOutcome:
        wake_fd(self._stop_w, b"\x00")
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(1.0)
        for conn in self.connections:
            try:
                conn.send((MSG_WORKER_STOP,))
            except OSError:
                pass
        outcome = shutdown_processes(self.processes, timeout)
        self.store = None  # the group's store goes once its ranks are gone
        for conn in self.connections:
            conn.close()
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        return outcome


def _start_from_daemon(proc: BaseProcess) -> None:
    """multiprocessing refuses children of a daemonic process (its exit would orphan them);
    every worker has a death pipe and is stopped by the EngineCore, so the flag is lifted."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    daemon = config.pop("daemon", None)
    try:
        proc.start()
    finally:
        if daemon is not None:
            config["daemon"] = daemon
