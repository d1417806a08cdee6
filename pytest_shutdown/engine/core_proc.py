"""run_engine_core: the EngineCore child-process entry, modelled on vLLM V1.

An input thread turns what arrives on the parent connection into ``input_queue`` items; an output
thread sends what the busy loop (``while handle_shutdown(): process_input(); step()``) puts on
``output_queue``.

SIGTERM/SIGINT handlers only set state and write one byte to a pipe; a helper thread turns it
into a wake-up item (a handler that touched the queue could deadlock on a lock the interrupted
main thread holds). The pipe is also the signal wake-up fd: the kernel may deliver the signal to
any thread and the Python handler runs only when the main thread runs bytecode again, so an idle
loop blocked on its queue would otherwise notice it only at its next ``IDLE_WAKE_S``.

Once ``run_engine_core`` ended in ``SystemExit`` an engine process exits with ``os._exit`` from
its first atexit callback, skipping 300-400 ms of interpreter finalization in a torch process
(this matters for ``spawn``: fork server and fork children end in ``os._exit`` already).
"""

from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import (
    EngineCore,
    EngineCoreOutput,
    EngineShutdownState,
    FinishReason,
    load_model,
)
from pytest_shutdown.engine.dp_group import DP_IDLE_WAKE_S, DataParallelGroup, DPGroupSpec
from pytest_shutdown.engine.faults import ChildFaults
from pytest_shutdown.engine.lifecycle import LifecycleLog
from pytest_shutdown.engine.lifeline import (
    EXIT_PARENT_GONE,
    ParentWatch,
    on_stop_signals,
    set_parent_death_signal,
    set_process_name,
    wake_fd,
)
from pytest_shutdown.engine.shm_ring import ShmRing
from pytest_shutdown.engine.start import heap_frozen_by_fork_server
from pytest_shutdown.engine.worker import WorkerGroup
from pytest_shutdown.gpu.forking import reset_after_fork
from pytest_shutdown.gpu.placement import place_rank

logger = logging.getLogger("pytest_shutdown.engine")

# Parent -> child messages (tuples; the first item is the kind).
MSG_ADD = "add"  # (MSG_ADD, request_id, prompt_token_ids, max_tokens)
MSG_ABORT = "abort"  # (MSG_ABORT, request_ids | None)
MSG_UTILITY = "utility"  # (MSG_UTILITY, call_id, name, args)
# Child -> parent messages.
MSG_READY = "ready"  # (MSG_READY, pid)
MSG_OUTPUTS = "outputs"  # (MSG_OUTPUTS, list[EngineCoreOutput])
MSG_UTILITY_RESULT = "utility_result"  # (MSG_UTILITY_RESULT, call_id, ok, value_or_error)
MSG_STARTUP_FAILED = "startup_failed"  # (MSG_STARTUP_FAILED, traceback_text)
MSG_ENGINE_DEAD = "engine_dead"  # (MSG_ENGINE_DEAD, traceback_text)
MSG_RING = "ring"  # (MSG_RING,): outputs are waiting in the shared-memory ring
# Internal items of the input queue.
_WAKE = ("wake",)
_PARENT_GONE = ("parent_gone",)
_WORKER_DIED = "worker_died"  # (_WORKER_DIED, name, pid, exitcode)

SHUTTING_DOWN_ERROR = "EngineCore is shutting down"
#: The idle busy loop wakes at least this often even without input.
IDLE_WAKE_S = 1.0
#: How long the child waits for its output thread to hand the last outputs to the parent.
OUTPUT_FLUSH_S = 1.0
#: After its parent dies, a child that has not exited by itself this long after is ended.
PARENT_GONE_EXIT_S = 1.0
STARTUP_POLL_S = 0.05


class SignalWaker:
    """A self-pipe: ``trigger()`` (async-signal-safe) makes a helper thread call ``wake``."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous_wakeup_fd: int | None = None
        self._thread = threading.Thread(target=self._run, name="signal-waker", daemon=True)
        self._thread.start()

    def wake_on_signals(self) -> None:
        """Make the pipe the signal wake-up fd (main thread only); a signal number is never 0,
        the stop byte."""
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)

    def trigger(self) -> None:
        wake_fd(self._w)

    def stop(self, timeout: float = 1.0) -> None:
        if self._previous_wakeup_fd is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._previous_wakeup_fd = None
        wake_fd(self._w, b"\x00")
        self._thread.join(timeout)
        if not self._thread.is_alive():
            os.close(self._r)
            os.close(self._w)

    def _run(self) -> None:
        while True:
            data = os.read(self._r, 64)
            if not data or b"\x00" in data:
                return
            self._wake()


class EngineCoreProc:
    """The child's side of one engine process: IO threads, the busy loop, the handlers."""

    def __init__(
        self, config: EngineConfig, conn: Connection, log: LifecycleLog, faults: ChildFaults
    ) -> None:
        self.config = config
        self.conn = conn
        self.log = log
        self.faults = faults
        self.input_queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.output_queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self.engine_core: EngineCore | None = None
        self.workers: WorkerGroup | None = None
        self.waker: SignalWaker | None = None
        self.shutdown_requested = False
        self.signals_received: list[int] = []
        self.parent_gone = False
        self.exit_code = 0
        self._drain_deadline: float | None = None
        self._output_thread: threading.Thread | None = None
        self.parent_gone_seen = threading.Event()
        self.graceful = True
        self.ring: ShmRing | None = None
        self.dp_group: DataParallelGroup | None = None

    def start_io_threads(self) -> None:
        threading.Thread(target=self._input_loop, name="engine-input", daemon=True).start()
        self._output_thread = threading.Thread(
            target=self._output_loop, name="engine-output", daemon=True
        )
        self._output_thread.start()

    def _input_loop(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                if self.faults.engine_lifeline and not (
                    self.faults.lifeline_after_startup and self.engine_core is None
                ):
                    self.on_parent_gone()  # the pipe to the parent is a death pipe too
                return
            self.input_queue.put(msg)

    def _output_loop(self) -> None:
        while True:
            msg = self.output_queue.get()
            if msg is None:
                return
            if msg[0] == MSG_OUTPUTS and self.ring is not None and self.ring.put(msg[1]):
                msg = (MSG_RING,)  # the data is in the ring: the connection only wakes the reader
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the parent is gone
                return

    def send(self, msg: tuple[Any, ...]) -> None:
        self.output_queue.put(msg)

    def flush_outputs(self, timeout: float = OUTPUT_FLUSH_S) -> None:
        if self._output_thread is not None:
            self.output_queue.put(None)
            self._output_thread.join(timeout)

    def signal_handler(self, signum: int, frame: object) -> None:
        """Only set state and wake the loop (through the helper thread)."""
        self.signals_received.append(signum)
        if self.faults.sigterm_raises_system_exit and signum == signal.SIGTERM:
            self.graceful = False
            raise SystemExit(0)  # the bug: the graceful path (which stops the workers) is skipped
        self.shutdown_requested = True
        core = self.engine_core
        if core is not None and core.shutdown_state == EngineShutdownState.RUNNING:
            core.shutdown_state = EngineShutdownState.REQUESTED
        if self.waker is not None:
            self.waker.trigger()

    def wake(self) -> None:
        if self.dp_group is not None:
            self.dp_group.stop(0)  # blocked in a DP collective: the watchdog ends it after grace
        self.input_queue.put(_WAKE)

    def on_parent_gone(self) -> None:
        self.parent_gone_seen.set()
        if self.dp_group is not None:
            self.dp_group.stop(EXIT_PARENT_GONE)
        self.input_queue.put(_PARENT_GONE)

    def on_worker_died(self, name: str, pid: int | None, exitcode: int | None) -> None:
        self.input_queue.put((_WORKER_DIED, name, pid, exitcode))

    def startup_interrupted(self) -> bool:
        return self.shutdown_requested or self.parent_gone_seen.is_set()

    def run_busy_loop(self) -> None:
        """Serve until a requested shutdown has no work left, then raise SystemExit."""
        if self.dp_group is not None:
            self._run_dp_busy_loop(self.dp_group)
        else:
            while self._handle_shutdown():
                self._process_input_queue(IDLE_WAKE_S)
                self._process_engine_step()
        core = self._core
        if self.faults.leave_work:
            core.add_request("left-behind", [1], 1)
        if self.faults.has_work_raises:
            setattr(core, "has_work", _raise_has_work)  # noqa: B010
        code = self.exit_code if self.faults.exit_code is None else self.faults.exit_code
        raise SystemExit(code)

    def _run_dp_busy_loop(self, group: DataParallelGroup) -> None:
        """vLLM's ``DPEngineCoreProc`` loop: every rank all-reduces its state every iteration
        (an idle one after ``DP_IDLE_WAKE_S``), so a stop told to one rank stops all of them at
        the same iteration. A failed all-reduce means a peer is gone."""
        core = self._core
        globally_unfinished = False
        while True:
            running = self._handle_shutdown()
            self._process_input_queue(0.0 if globally_unfinished else DP_IDLE_WAKE_S)
            if running:
                self._process_engine_step()
            try:
                state = group.sync(
                    unfinished=core.has_work(), stop_requested=self.shutdown_requested,
                    done=not running,
                )
            except RuntimeError as exc:
                self.log.event("dp_collective_failed", dp_rank=group.dp_rank, error=str(exc)[:500])
                if self.shutdown_requested:
                    core.abort_requests(None)
                    return
                raise RuntimeError(
                    f"EngineCore_DP{group.dp_rank}: a data-parallel peer is gone: {exc}"
                ) from exc
            if state.stop_requested and not self.shutdown_requested:
                self.log.event("dp_stop_from_peer", dp_rank=group.dp_rank)
                self.shutdown_requested = True  # a peer was told to stop: the group stops
            if state.all_done:
                group.left_together = True
                return
            globally_unfinished = state.unfinished

    @property
    def _core(self) -> EngineCore:
        assert self.engine_core is not None
        return self.engine_core

    def _handle_shutdown(self) -> bool:
        core = self._core
        if self.shutdown_requested and core.shutdown_state == EngineShutdownState.RUNNING:
            core.shutdown_state = EngineShutdownState.REQUESTED
        if core.shutdown_state == EngineShutdownState.RUNNING:
            return True
        if core.shutdown_state == EngineShutdownState.REQUESTED:
            if self.faults.exit_while_requested:
                raise SystemExit(0)
            timeout = self.config.shutdown_timeout
            unfinished = core.num_unfinished_requests()
            if timeout == 0 or self.parent_gone:
                mode = "abort"
                core.abort_requests(None)
            else:
                mode = "drain"
                if timeout is not None:
                    self._drain_deadline = time.monotonic() + timeout
            logger.info("[shutdown] EngineCore: %s %d request(s)", mode, unfinished)
            self.log.event(
                "shutdown_requested", mode=mode, unfinished=unfinished,
                signals=list(self.signals_received), parent_gone=self.parent_gone,
            )
            core.shutdown_state = EngineShutdownState.SHUTTING_DOWN
        if core.num_unfinished_requests() and (
            self.parent_gone
            or (self._drain_deadline is not None and time.monotonic() >= self._drain_deadline)
        ):
            aborted = core.abort_requests(None)
            self.log.event("drain_cut_short", aborted=len(aborted), parent_gone=self.parent_gone)
        return core.has_work()

    def _process_input_queue(self, idle_wait_s: float) -> None:
        core = self._core
        idle = (
            idle_wait_s > 0
            and core.shutdown_state == EngineShutdownState.RUNNING
            and not self.shutdown_requested
            and not core.has_work()
        )
        try:
            msg = self.input_queue.get(block=idle, timeout=idle_wait_s)
            while True:
                self._handle_input(msg)
                msg = self.input_queue.get_nowait()
        except queue.Empty:
            return

    def _handle_input(self, msg: tuple[Any, ...]) -> None:
        core = self._core
        kind = msg[0]
        running = core.shutdown_state == EngineShutdownState.RUNNING and not self.shutdown_requested
        if kind == "wake":
            return
        if kind == _WORKER_DIED:
            _, name, pid, exitcode = msg
            if running:
                raise RuntimeError(f"{name} (pid {pid}) died with exit code {exitcode}")
            return
        if kind == "parent_gone":
            self.parent_gone = True
            self.shutdown_requested = True
            self.exit_code = EXIT_PARENT_GONE
            if core.shutdown_state == EngineShutdownState.RUNNING:
                core.shutdown_state = EngineShutdownState.REQUESTED
        elif kind == MSG_ADD:
            _, request_id, prompt, max_tokens = msg
            if not running:
                self.log.event("request_rejected", request_id=request_id)
                self.send((MSG_OUTPUTS, [_aborted(request_id)]))
                return
            try:
                core.add_request(request_id, prompt, max_tokens)
            except ValueError as exc:
                logger.warning("EngineCore: rejected request %r: %s", request_id, exc)
                self.send((MSG_OUTPUTS, [_aborted(request_id)]))
        elif kind == MSG_ABORT:
            core.abort_requests(msg[1])
        elif kind == MSG_UTILITY:
            _, call_id, name, args = msg
            if not running:
                self.send((MSG_UTILITY_RESULT, call_id, False, SHUTTING_DOWN_ERROR))
                return
            try:
                result = core.utility(name, *args)
            except Exception as exc:  # noqa: BLE001 - the caller gets the error
                self.send((MSG_UTILITY_RESULT, call_id, False, f"{type(exc).__name__}: {exc}"))
            else:
                self.send((MSG_UTILITY_RESULT, call_id, True, result))
        else:
            logger.warning("EngineCore: unknown message kind %r", kind)

    def _process_engine_step(self) -> None:
        core = self._core
        if core.has_work():
            outputs = core.step()
            if self.workers is not None:
                self.workers.step()
            if outputs:
                self.send((MSG_OUTPUTS, outputs))


def _arm_lifeline(
    proc: EngineCoreProc, parent_pid: int | None, pdeathsig: bool
) -> ParentWatch | None:
    if pdeathsig:
        set_parent_death_signal(signal.SIGTERM)
    if parent_pid is None:
        return None
    return ParentWatch(parent_pid, proc.on_parent_gone, exit_after_s=PARENT_GONE_EXIT_S).start()


def is_clean_shutdown(code: object, engine_core: EngineCore | None, config: EngineConfig) -> bool:
    """vLLM's ``clean_shutdown`` test; never raises (an error makes the shutdown unclean)."""
    try:
        return (
            code in (None, 0)
            and engine_core is not None
            and engine_core.shutdown_state == EngineShutdownState.SHUTTING_DOWN
            and not engine_core.has_work()
            and config.shutdown_timeout == 0
        )
    except Exception:  # noqa: BLE001 - must never replace the SystemExit being handled
        logger.exception("[shutdown] EngineCore: could not tell whether the exit was clean")
        return False


def run_engine_core(
    config: EngineConfig,
    conn: Connection,
    *,
    dp_rank: int = 0,
    parent_pid: int | None = None,
    lifecycle_log: str | None = None,
    faults: ChildFaults | None = None,
    pdeathsig: bool = False,
    exiting: bool = False,
    ring_name: str | None = None,
    dp_group: DPGroupSpec | None = None,
) -> None:
    """Run one EngineCore in this (child) process until it is told to stop; ends in SystemExit.

    ``exiting``: the process ends as soon as this returns, so SIGTERM/SIGINT stay ignored after
    the cleanup: a late duplicate SIGTERM (a DP supervisor signals the whole process group, then
    the manager each engine) must not turn a clean exit into death by signal.
    ``parent_pid``: the logical parent; when it dies this process exits within about
    ``PARENT_GONE_EXIT_S``. ``pdeathsig``: also ask the kernel for a SIGTERM when the forking
    thread exits (see ``start.pdeathsig_safe``). ``ring_name``: the outputs go through a
    shared-memory ring of that name (created and unlinked here). ``dp_group``: join the DP group
    once loaded. Must run in the main thread (it installs signal handlers).
    """
    faults = faults if faults is not None else ChildFaults()
    log = LifecycleLog(lifecycle_log)
    proc = EngineCoreProc(config, conn, log, faults)
    platform = config.resolved_platform
    engine_core: EngineCore | None = None
    parent_watch: ParentWatch | None = None
    workers: WorkerGroup | None = None
    clean_shutdown = False
    lifeline = faults.engine_lifeline
    try:
        deadline = time.monotonic() + config.startup_timeout_s
        _install_handlers(proc, log, dp_rank, ring_name)
        if config.tensor_parallel_size > 1:
            # Before any other thread of this process starts: the workers are its forks.
            workers = WorkerGroup(
                config, dp_rank, lifecycle_log,
                lifeline=faults.worker_lifeline,
                lifeline_while_loading=faults.worker_lifeline and not faults.lifeline_after_startup,
            )
        if lifeline and not faults.lifeline_after_startup:
            parent_watch = _arm_lifeline(proc, parent_pid, pdeathsig)
        proc.start_io_threads()
        _start_up(proc, workers, faults, deadline, dp_rank)
        engine_core = _build_engine(proc, dp_rank, dp_group, log)
        proc.engine_core = engine_core
        if workers is not None:
            proc.workers = workers
            workers.watch(proc.on_worker_died)
        if lifeline and faults.lifeline_after_startup:
            parent_watch = _arm_lifeline(proc, parent_pid, pdeathsig)
        log.event("engine_built", signals=list(proc.signals_received))
        proc.send((MSG_READY, os.getpid()))
        proc.run_busy_loop()
    except SystemExit as exc:
        clean_shutdown = is_clean_shutdown(exc.code, engine_core, config)
        log.event("loop_exited", code=exc.code, clean=clean_shutdown)
        raise
    except Exception:
        text = traceback.format_exc()
        log.event("engine_failed", error=text)
        kind = MSG_STARTUP_FAILED if engine_core is None else MSG_ENGINE_DEAD
        proc.send((kind, text))
        raise
    finally:
        on_stop_signals(signal.SIG_IGN)
        _clean_up(proc, log, engine_core, workers)
        after = signal.SIG_IGN if exiting else signal.SIG_DFL
        on_stop_signals(after)
        log.event("handlers_restored", handlers="ignored" if exiting else "default")
        if parent_watch is not None:
            parent_watch.stop()
        if clean_shutdown and platform == "rocm":
            # Skips the slow cyclic GC at interpreter finalization of this exiting process.
            gc.freeze()
            if log.enabled:  # get_freeze_count() walks the whole frozen heap
                log.event("gc_frozen", freeze_count=gc.get_freeze_count())


def _install_handlers(
    proc: EngineCoreProc, log: LifecycleLog, dp_rank: int, ring_name: str | None
) -> None:
    """First thing, so that a signal during start-up is seen and the cleanup finds the ring."""
    if ring_name is not None:
        proc.ring = ShmRing.create(ring_name)
    proc.waker = SignalWaker(proc.wake)
    on_stop_signals(proc.signal_handler)
    proc.waker.wake_on_signals()
    log.event("handlers_installed", dp_rank=dp_rank)
    set_process_name(f"EngineCore_DP{dp_rank}")


def _start_up(
    proc: EngineCoreProc,
    workers: WorkerGroup | None,
    faults: ChildFaults,
    deadline: float,
    dp_rank: int,
) -> None:
    if faults.signal_before_engine:
        os.kill(os.getpid(), signal.SIGTERM)
    if workers is not None:
        if faults.lifeline_after_startup:
            workers.wait_ready_untimed()
        else:
            workers.wait_ready(deadline, proc.startup_interrupted)
    else:
        load_model(
            proc.config.startup_delay_s, proc.startup_interrupted, proc.parent_gone_seen,
            STARTUP_POLL_S,
        )
    if faults.startup_delay_s:
        time.sleep(faults.startup_delay_s)
    if dp_rank in faults.fail_startup_ranks:
        time.sleep(faults.fail_startup_after_s)
        raise RuntimeError(f"injected startup failure in EngineCore_DP{dp_rank}")


def _build_engine(
    proc: EngineCoreProc, dp_rank: int, dp_group: DPGroupSpec | None, log: LifecycleLog
) -> EngineCore:
    placed = place_rank(proc.config, dp_rank)
    if dp_group is not None and not proc.startup_interrupted():
        proc.dp_group = DataParallelGroup(
            dp_rank, dp_group, placed, lambda code: _exit_stuck(log, dp_rank, code)
        )
        proc.dp_group.join()
        log.event("dp_group_joined", dp_rank=dp_rank, backend=dp_group.backend)
    return EngineCore(placed)


def _clean_up(
    proc: EngineCoreProc,
    log: LifecycleLog,
    engine_core: EngineCore | None,
    workers: WorkerGroup | None,
) -> None:
    """vLLM's order; the DP group first: the ranks that left the loop together meet at its
    barrier."""
    log.event("cleanup_started")
    if proc.dp_group is not None:
        _leave_dp_group(proc.dp_group, log)
    if proc.waker is not None:
        proc.waker.stop()
    proc.flush_outputs()
    if proc.ring is not None:
        proc.ring.close()
        proc.ring.unlink()
    if engine_core is not None:
        engine_core.shutdown()
    if workers is not None and proc.graceful:
        workers.shutdown()
    if heap_frozen_by_fork_server():
        gc.unfreeze()
    log.event("cleanup_finished")


def _leave_dp_group(group: DataParallelGroup, log: LifecycleLog) -> None:
    try:
        ending = group.leave()
    except Exception as exc:  # noqa: BLE001 - the cleanup must go on
        ending = f"failed: {exc}"
    log.event("dp_group_left", dp_rank=group.dp_rank, ending=ending, steps=group.group.steps)


def _exit_stuck(log: LifecycleLog, dp_rank: int, code: int) -> None:
    log.event("dp_collective_abandoned", dp_rank=dp_rank, code=code)
    os._exit(code)


def engine_process_main(
    config: EngineConfig,
    conn: Connection,
    dp_rank: int,
    parent_pid: int | None,
    lifecycle_log: str | None,
    faults: ChildFaults | None,
    pdeathsig: bool,
    ring_name: str | None = None,
    dp_group: DPGroupSpec | None = None,
) -> None:
    """Target of every engine process; its ``final`` event is the state the interpreter exits
    with (after ``run_engine_core``'s ``finally`` and any ``gc.freeze()``)."""
    reset_after_fork(config.start_method)
    log = LifecycleLog(lifecycle_log)
    if log.enabled:  # get_freeze_count() walks the whole frozen heap (~20 ms under torch)
        log.event("started", dp_rank=dp_rank, freeze_count=gc.get_freeze_count())
    code: object = None
    try:
        run_engine_core(
            config, conn, dp_rank=dp_rank, parent_pid=parent_pid,
            lifecycle_log=lifecycle_log, faults=faults, pdeathsig=pdeathsig, exiting=True,
            ring_name=ring_name, dp_group=dp_group,
        )
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            skip_finalization_at_exit(0 if code is None else code)
        raise
    except BaseException as exc:
        code = type(exc).__name__
        raise
    finally:
        if log.enabled:
            log.event("final", exit=code, freeze_count=gc.get_freeze_count())


def skip_finalization_at_exit(exit_code: int) -> bool:
    """In a multiprocessing child: end the interpreter with ``os._exit(exit_code)`` at exit.

    Registered last, the callback runs first among the atexit callbacks, after multiprocessing
    joined the threads, ran its finalizers and flushed the streams; it skips the other atexit
    callbacks, module teardown and the final collections. ``exit_code`` must be the code the
    process would exit with anyway. False (nothing done) outside a multiprocessing child.
    """
    if multiprocessing.parent_process() is None:
        return False
    atexit.register(_exit_now, exit_code)
    return True


def _exit_now(exit_code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(exit_code)


def _aborted(request_id: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [], FinishReason.ABORTED)


def _raise_has_work() -> bool:
    raise RuntimeError("injected fault: has_work() failed")
