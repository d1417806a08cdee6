"""The reference engine's whole process tree: frontend → EngineCore_DP{i} → Worker_TP{j}.

``serve_frontend`` is the root of vLLM's topology as an API server runs it, and what the
tree-death helper and the ``orphan_matrix`` marker run for the reference engine. Signal handlers
only set a ``SignalStop``: an exception raised from a handler can land in a fork hook or a
``finally`` and be swallowed (the matrix found exactly that). ``exit_hang_bug`` puts back vLLM
PR #38779 / vllm-rbln PR #639: a non-daemon output thread nobody stops, which the interpreter's
exit waits for forever.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

from pytest_shutdown._os.phases import phase_pattern, report_phase, wanted_phase
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.faults import ChildFaults
from pytest_shutdown.engine.lifeline import on_stop_signals, set_process_name
from pytest_shutdown.engine.processes import EngineProcManager, StartupInterrupted
from pytest_shutdown.engine.stop_flag import SignalStop

#: The levels of the reference tree, for the tree-death helper: the root, and name patterns.
REFERENCE_LEVELS = {"frontend": "root", "engine_core": "EngineCore_DP*", "worker": "Worker_TP*"}


class ProcessesLoading:
    """Phase marker ``starting``: ``count`` processes named ``prefix``* exist and are loading
    (the line ``starting`` comes before they exist)."""

    def __init__(self, prefix: str, count: int) -> None:
        self.prefix = prefix
        self.count = count

    def __call__(self, output: str, processes: Sequence[Any]) -> bool:
        loading = phase_pattern("starting").search(output) and not phase_pattern(
            "ready"
        ).search(output)
        found = sum(1 for p in processes if p.name.startswith(self.prefix))
        return bool(loading) and found >= self.count


#: The phases of the reference tree as ``matrix_config()`` builds it (tp=2, dp=2: 4 workers).
REFERENCE_PHASES = {"starting": ProcessesLoading("Worker_TP", 4)}
#: Every phase the frontend reports (declared to the test: an unknown one fails at once).
FRONTEND_PHASES = ("starting", "ready", "busy", "shutting_down", "in_collective")
SERVE_POLL_S = 0.02
#: Requests kept in flight per EngineCore in the ``busy`` phase, and their length.
BUSY_REQUESTS_PER_ENGINE = 2
BUSY_MAX_TOKENS = 1_000_000
#: Model loading in the ``starting`` phase: longer than any test waits.
STARTING_LOAD_S = 30.0
#: EngineCore teardown in the ``shutting_down`` phase: the window a signal must land in.
SHUTTING_DOWN_TEARDOWN_S = 1.0
FIRST_OUTPUT_TIMEOUT_S = 30.0
#: The straggling rank's delay in the ``in_collective`` phase: longer than any test waits.
IN_COLLECTIVE_STRAGGLE_S = 30.0


def matrix_config(**changes: Any) -> EngineConfig:
    """The reference tree the orphan matrix runs: tp=2, dp=2 on the CPU, scaled-down graces,
    forked EngineCores (the frontend never touches a device): a tree starts in tens of ms."""
    base: dict[str, Any] = dict(
        platform="cpu",
        tensor_parallel_size=2,
        data_parallel_size=2,
        start_method="fork",
        kv_cache_bytes=1 << 16,
        renderer_num_workers=1,
        default_process_timeout_s=3.0,
        rocm_process_grace_s=1.5,
        startup_delay_s=0.0,
        startup_timeout_s=60.0,
        step_delay_s=0.01,
    )
    base.update(changes)
    return EngineConfig(**base)


def stretched_for(
    wanted: str | None, config: EngineConfig, starting_load_s: float, teardown_s: float
) -> EngineConfig:
    """``config`` with model loading (phase ``starting``) or each EngineCore's teardown (phase
    ``shutting_down``) lasting at least as long as the phase needs."""
    if wanted == "starting":
        return config.replace(startup_delay_s=max(config.startup_delay_s, starting_load_s))
    if wanted == "shutting_down":
        return config.replace(teardown_delay_s=max(config.teardown_delay_s, teardown_s))
    return config


def serve_frontend(
    config: EngineConfig | None = None,
    *,
    faults: ChildFaults | None = None,
    exit_hang_bug: bool = False,
    starting_load_s: float = STARTING_LOAD_S,
    shutting_down_teardown_s: float = SHUTTING_DOWN_TEARDOWN_S,
    in_collective_straggle_s: float = IN_COLLECTIVE_STRAGGLE_S,
) -> int:
    """Run the reference tree until told to stop; returns the exit code (1: an engine died).

    It reaches the phase the test wants (``wanted_phase()``), stretching what it needs: model
    loading takes ``starting_load_s``, each EngineCore's teardown ``shutting_down_teardown_s``,
    the last TP rank enters each collective ``in_collective_straggle_s`` late (a config with
    ``process_group``); ``busy`` keeps requests in flight. Must run in the main thread.
    """
    wanted = wanted_phase(known=FRONTEND_PHASES)
    config = stretched_for(
        wanted, config or matrix_config(), starting_load_s, shutting_down_teardown_s
    )
    if wanted == "in_collective":
        if config.process_group == "off":
            raise ValueError("phase 'in_collective' needs EngineConfig.process_group != 'off'")
        config = config.replace(
            collective_straggle_s=max(config.collective_straggle_s, in_collective_straggle_s)
        )
    set_process_name("Frontend")
    stop = SignalStop()
    on_stop_signals(lambda signum, frame: stop.set())
    report_phase("starting")
    try:
        manager = EngineProcManager(config, faults=faults, interrupt=stop)
    except StartupInterrupted:
        return 1
    code = 0
    try:
        report_phase("ready")
        if exit_hang_bug:
            threading.Thread(
                target=_handle_outputs_forever, args=(manager.outputs,), name="output-handler"
            ).start()
        if wanted in ("busy", "in_collective"):
            _start_load(manager, config)
            report_phase("busy")
        if wanted == "shutting_down":
            stop.set()
        while not stop.wait(SERVE_POLL_S):
            if manager.failures or manager.is_shut_down:
                code = 1
                break
            if not exit_hang_bug:
                _drain(manager.outputs)
    finally:
        report_phase("shutting_down")
        manager.shutdown()
    return code


def _start_load(manager: Any, config: EngineConfig) -> None:
    for i in range(BUSY_REQUESTS_PER_ENGINE * config.data_parallel_size):
        manager.add_request(f"busy-{i}", [1, 2, 3], BUSY_MAX_TOKENS)
    manager.outputs.get(timeout=FIRST_OUTPUT_TIMEOUT_S)


def _drain(outputs: queue.Queue[Any]) -> None:
    try:
        while True:
            outputs.get_nowait()
    except queue.Empty:
        pass


def _handle_outputs_forever(outputs: queue.Queue[Any]) -> None:
    while True:
        outputs.get()
