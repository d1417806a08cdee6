"""The async front end as a process tree for the orphan matrix: ``AsyncLLM`` → EngineCore_DP{i}.

``serve_async_frontend`` runs an ``AsyncLLM`` in ``asyncio.run`` as the root of a tree (an API
server's process), announces its phases (``starting``, ``ready``, ``busy``, ``shutting_down``)
with ``report_phase`` and reaches the one the test wants: ``starting`` holds model loading,
``busy`` keeps requests in flight, ``shutting_down`` closes by itself with a slow EngineCore
teardown (the window a signal must land in). SIGTERM/SIGINT (a loop signal handler) close it
gracefully. ``ASYNC_LEVELS`` and ``ASYNC_PHASES`` are what ``kill_tree`` needs::

    @pytest.mark.orphan_matrix(level=["frontend"], phase=["starting", "busy", "shutting_down"])
    def test_...(kill_tree):
        kill_tree(serve_async_frontend, levels=ASYNC_LEVELS, phases=ASYNC_PHASES)
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from pytest_shutdown._os.phases import report_phase, wanted_phase
from pytest_shutdown.engine.async_llm import AsyncLLM
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.frontend import (
    BUSY_MAX_TOKENS,
    BUSY_REQUESTS_PER_ENGINE,
    SHUTTING_DOWN_TEARDOWN_S,
    STARTING_LOAD_S,
    ProcessesLoading,
    stretched_for,
)
from pytest_shutdown.engine.lifeline import set_process_name

#: The levels of the async tree, for the tree-death helper: the root, and name patterns.
ASYNC_LEVELS = {"frontend": "root", "engine_core": "EngineCore_DP*"}
#: Every phase the async front end reports.
ASYNC_FRONTEND_PHASES = ("starting", "ready", "busy", "shutting_down")


def async_matrix_config(**changes: Any) -> EngineConfig:
    """The async tree the orphan matrix runs: dp=2 on the CPU, scaled-down graces.

    ``spawn``: a fork server's listener socket file (multiprocessing's) stays on disk when the
    front end that owns it is SIGKILLed, which the matrix rightly reports (``port-leak``).
    """
    base: dict[str, Any] = dict(
        platform="cpu",
        data_parallel_size=2,
        kv_cache_bytes=1 << 16,
        start_method="spawn",
        default_process_timeout_s=3.0,
        startup_timeout_s=60.0,
        step_delay_s=0.01,
    )
    base.update(changes)
    return EngineConfig(**base)


#: The phases of the async tree as ``async_matrix_config()`` builds it (dp=2).
ASYNC_PHASES = {"starting": ProcessesLoading("EngineCore_DP", 2)}


def serve_async_frontend(config: EngineConfig | None = None) -> int:
    """Run the async tree until told to stop; returns the exit code (1: an engine died)."""
    wanted = wanted_phase(known=ASYNC_FRONTEND_PHASES)
    config = stretched_for(
        wanted, config or async_matrix_config(), STARTING_LOAD_S, SHUTTING_DOWN_TEARDOWN_S
    )
    set_process_name("AsyncFrontend")
    return asyncio.run(_serve(config, wanted))


async def _serve(config: EngineConfig, wanted: str | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    report_phase("starting")
    engine = AsyncLLM.from_config(config)
    busy: list[asyncio.Task[None]] = []
    code = 0
    try:
        start = asyncio.ensure_future(engine.start())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not start.done():
            start.cancel()
            return 1
        start.result()
        report_phase("ready")
        if wanted == "busy":
            first = asyncio.Event()
            busy = [
                asyncio.create_task(_keep_busy(engine, f"busy-{i}", first))
                for i in range(BUSY_REQUESTS_PER_ENGINE * config.data_parallel_size)
            ]
            await first.wait()
            report_phase("busy")
        if wanted != "shutting_down":
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                if engine.engine_dead:
                    code = 1
                    break
    finally:
        report_phase("shutting_down")
        for task in busy:
            task.cancel()
        await engine.aclose()
    return code


async def _keep_busy(engine: AsyncLLM, request_id: str, first: asyncio.Event) -> None:
    async for _ in engine.generate("busy", BUSY_MAX_TOKENS, request_id=request_id):
        first.set()
