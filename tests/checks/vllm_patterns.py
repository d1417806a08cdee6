"""Copies of vLLM 0.33.0's shutdown patterns, and each seed bug put back, for the helper tests.

vLLM itself stays out of ``make test`` (``examples/vllm`` runs the helpers on the real modules
under ``make vllm-check``). These classes keep the shape the helpers must handle on real code:
a policy that reads its platform from global state, a manager whose ``shutdown`` returns nothing
and hands its budget to a module-level reaper, a finalizer calling that module function, an
executor hidden inside a wrapper, and an EngineCore entry that freezes its heap on a clean ROCm
exit.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from multiprocessing.process import BaseProcess
from typing import Any

from pytest_shutdown.engine.stop_flag import SignalStop

ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S = 15.0
CHILD_EXIT_GRACE_S = 5.0
DEFAULT_TIMEOUT_S = 5.0


class Platform:
    """``vllm.platforms.current_platform``: global state a policy reads, not an argument."""

    def __init__(self) -> None:
        self.name = "cuda"

    def is_rocm(self) -> bool:
        return self.name == "rocm"


current_platform = Platform()


@contextlib.contextmanager
def on_platform(name: str) -> Iterator[None]:
    """The platform hook: make ``name`` the current platform for one cell."""
    previous = current_platform.name
    current_platform.name = name
    try:
        yield
    finally:
        current_platform.name = previous

#: ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, as vLLM's envs module reads it.
ENV_WINDOW = "PYTEST_SHUTDOWN_TEST_WORKER_SHUTDOWN_TIMEOUT_SECONDS"


# -- the timeout policy (vllm/v1/engine/utils.py) -------------------------------------------------


def get_engine_process_shutdown_timeout(
    request_timeout: float | None, process_timeout: float | None
) -> float | None:
    if request_timeout == 0 and process_timeout == 0:
        if ENV_WINDOW in os.environ:
            return float(os.environ[ENV_WINDOW])
        if current_platform.is_rocm():
            return ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S
    return process_timeout


def policy_ignoring_the_platform(
    request_timeout: float | None, process_timeout: float | None
) -> float | None:
    """Seed bug: the ROCm grace on every platform."""
    if request_timeout == 0 and process_timeout == 0:
        return ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S
    return process_timeout


def policy_regracing_a_spent_budget(
    request_timeout: float | None, process_timeout: float | None
) -> float | None:
    """Seed bug: a zero remaining budget after a positive drain gets a fresh grace on ROCm."""
    if process_timeout == 0 and current_platform.is_rocm():
        return ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S
    return process_timeout


# -- the process reaper (vllm/v1/utils.py: shutdown) ----------------------------------------------


def shutdown(procs: list[BaseProcess], timeout: float | None = None) -> None:
    """SIGTERM all, one shared deadline, SIGKILL the survivors; returns nothing."""
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_S
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if proc.is_alive():
            proc.join(remaining)
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGKILL)


def engine_main(ignore_sigterm: bool, ready: Any) -> None:
    """A child that exits on SIGTERM, or (a hung teardown) ignores it."""
    stop = SignalStop()
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    ready.set()
    stop.wait(60.0)


def start_engines(count: int, *, ignore_sigterm: bool = False) -> list[BaseProcess]:
    context = get_context("fork")
    procs: list[BaseProcess] = []
    for index in range(count):
        ready = context.Event()
        proc = context.Process(
            target=engine_main, args=(ignore_sigterm, ready), name=f"EngineCore_DP{index}"
        )
        proc.start()
        if not ready.wait(30.0):
            raise RuntimeError(f"{proc.name} did not start")
        procs.append(proc)
    return procs


# -- the process manager (CoreEngineProcManager) --------------------------------------------------


class CoreEngineProcManager:
    """``shutdown`` detaches the finalizer, asks the policy, hands the budget to ``shutdown``."""

    def __init__(self, request_shutdown_timeout: float | None, engines: int = 0) -> None:
        self._request_shutdown_timeout = request_shutdown_timeout
        self.processes: list[BaseProcess] = start_engines(engines)
        self._finalizer = weakref.finalize(self, shutdown, self.processes)
        self.manager_stopped = threading.Event()

    def shutdown(self, timeout: float | None = None) -> None:
        self.manager_stopped.set()
        if self._finalizer.detach() is not None:
            process_timeout = get_engine_process_shutdown_timeout(
                self._request_shutdown_timeout, timeout
            )
            shutdown(self.processes, timeout=process_timeout)


class ManagerIgnoringThePolicy(CoreEngineProcManager):
    """Seed bug: the policy exists, but the manager passes the caller's timeout on unchanged."""

    def shutdown(self, timeout: float | None = None) -> None:
        self.manager_stopped.set()
        if self._finalizer.detach() is not None:
            shutdown(self.processes, timeout=timeout)


class ManagerWithoutDetachGuard(CoreEngineProcManager):
    """Seed bug: every shutdown runs the reaper again, also after the finalizer ran."""

    def shutdown(self, timeout: float | None = None) -> None:
        self.manager_stopped.set()
        self._finalizer.detach()
        shutdown(
            self.processes,
            timeout=get_engine_process_shutdown_timeout(self._request_shutdown_timeout, timeout),
        )


# -- the DP supervisor's wait (vllm/entrypoints/launchers/dp_supervisor.py) -----------------------


def _join_processes_with_timeout(processes: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        process.join(timeout=remaining)


class DPSupervisor:
    def __init__(self, shutdown_timeout: float) -> None:
        self.shutdown_timeout = shutdown_timeout
        self._processes: list[BaseProcess] = []

    def shutdown_children(self) -> None:
        process_timeout = get_engine_process_shutdown_timeout(
            self.shutdown_timeout, self.shutdown_timeout
        )
        assert process_timeout is not None
        _join_processes_with_timeout(self._processes, process_timeout + CHILD_EXIT_GRACE_S)


class SupervisorWithoutChildGrace(DPSupervisor):
    """Seed bug: the children get the policy's window only, none to exit after it."""

    def shutdown_children(self) -> None:
        process_timeout = get_engine_process_shutdown_timeout(
            self.shutdown_timeout, self.shutdown_timeout
        )
        assert process_timeout is not None
        _join_processes_with_timeout(self._processes, process_timeout)


# -- the renderer (vllm/renderers/base.py) --------------------------------------------------------


class SwappableExecutor(Executor):
    """``_SwappableExecutor``: an Executor whose pool lives in ``_inner``."""

    def __init__(self, max_workers: int) -> None:
        super().__init__()
        self._max_workers = max_workers
        self._inner = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="swap-tok")

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._inner.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._inner.shutdown(wait=wait, cancel_futures=cancel_futures)


class Renderer:
    """``BaseRenderer``: one ExitStack, ``finalize(self, self._resources.close)``."""

    def __init__(self, workers: int = 2) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = SwappableExecutor(max_workers=workers)
        self._resources.callback(self._executor.shutdown, wait=False)
        self._mm_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swap-mm")
        self._resources.callback(self._mm_executor.shutdown, wait=False)

    def shutdown(self) -> None:
        self._resources.close()


class RendererEnteringTheWrapper(Renderer):
    """Seed bug: ``enter_context(executor)`` closes the wrapper with ``shutdown(wait=True)``."""

    def __init__(self, workers: int = 2) -> None:
        super().__init__(workers)
        self._resources = ExitStack()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._resources.enter_context(self._executor)
        self._resources.callback(self._mm_executor.shutdown, wait=False)


# -- EngineCoreProc.run_engine_core's exit (vllm/v1/engine/core.py) -------------------------------


class EngineCore:
    """Ends its busy loop like vLLM's: SystemExit after draining, or an error."""

    def __init__(self, shutdown_timeout: float, fail: bool) -> None:
        self.shutdown_timeout = shutdown_timeout
        self.fail = fail
        self.shutting_down = False

    def run_busy_loop(self) -> None:
        if self.fail:
            raise RuntimeError("engine failed")
        self.shutting_down = True
        raise SystemExit(0)

    def has_work(self) -> bool:
        return False

    def shutdown(self) -> None:
        gc.collect()


def _clean(exit: SystemExit, engine_core: EngineCore) -> bool:
    """vLLM's "clean shutdown": exit code 0, shutting down, no work left, a zero drain budget."""
    return (
        exit.code in (None, 0)
        and engine_core.shutting_down
        and not engine_core.has_work()
        and engine_core.shutdown_timeout == 0
    )


def run_engine_core(
    platform: str, shutdown_timeout: float, fail: bool, clean: Any = _clean
) -> None:
    current_platform.name = platform
    clean_shutdown = False
    engine_core = EngineCore(shutdown_timeout, fail)
    try:
        engine_core.run_busy_loop()
    except SystemExit as e:
        clean_shutdown = clean(e, engine_core)
        raise
    finally:
        engine_core.shutdown()
        if clean_shutdown and current_platform.is_rocm():
            gc.freeze()


def run_engine_core_freezing_everywhere(platform: str, shutdown_timeout: float, fail: bool) -> None:
    """Seed bug: the freeze is not limited to ROCm."""
    current_platform.name = platform
    engine_core = EngineCore(shutdown_timeout, fail)
    try:
        engine_core.run_busy_loop()
    except SystemExit:
        if engine_core.shutdown_timeout == 0:
            gc.freeze()
        raise
    finally:
        engine_core.shutdown()


def run_engine_core_freezing_after_drain(
    platform: str, shutdown_timeout: float, fail: bool
) -> None:
    """Seed bug: "clean" forgets the zero drain budget, so a drained ROCm exit freezes too."""
    run_engine_core(
        platform,
        shutdown_timeout,
        fail,
        clean=lambda exit, engine_core: exit.code in (None, 0) and not engine_core.has_work(),
    )
