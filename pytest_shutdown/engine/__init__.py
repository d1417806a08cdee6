"""The bundled reference engine, modelled on vLLM V1: its public names, re-exported lazily.

Importing this package imports no torch, and neither do ``EngineConfig``, the timeout policy,
``ReferenceRenderer`` or the start-method helpers: torch is imported when a name that needs it is
first used (``EngineCore`` and everything that runs one: ``EngineProcManager``, ``ReferenceLLM``,
``DPSupervisor``, ``run_engine_core``, ``shutdown_processes``). docs/api.md lists which is which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_shutdown._fast.lazy_exports import lazy_exports

_LAZY: dict[str, str] = {
    # no torch
    "EngineConfig": "pytest_shutdown.engine.config",
    "get_engine_process_shutdown_timeout": "pytest_shutdown.engine.timeouts",
    "ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S": "pytest_shutdown.engine.timeouts",
    "ReferenceRenderer": "pytest_shutdown.engine.renderer",
    "helper_process_pids": "pytest_shutdown.engine.start",
    "ForkRefusedError": "pytest_shutdown.gpu.forking",
    "RankGroup": "pytest_shutdown.engine.distributed",
    "GroupDeadlines": "pytest_shutdown.engine.distributed",
    "select_backend": "pytest_shutdown.engine.distributed",
    "free_port": "pytest_shutdown.engine.distributed",
    "host_store": "pytest_shutdown.engine.distributed",
    # torch
    "EngineCore": "pytest_shutdown.engine.core",
    "EngineShutdownState": "pytest_shutdown.engine.core",
    "FinishReason": "pytest_shutdown.engine.core",
    "ChildFaults": "pytest_shutdown.engine.core_proc",
    "run_engine_core": "pytest_shutdown.engine.core_proc",
    "ShutdownOutcome": "pytest_shutdown.engine.processes",
    "shutdown_processes": "pytest_shutdown.engine.processes",
    "kill_process_tree": "pytest_shutdown.engine.processes",
    "EngineProcManager": "pytest_shutdown.engine.processes",
    "EngineStartupError": "pytest_shutdown.engine.processes",
    "ProcessFailure": "pytest_shutdown.engine.processes",
    "ReferenceLLM": "pytest_shutdown.engine.llm",
    "RequestOutput": "pytest_shutdown.engine.llm",
    "DPSupervisor": "pytest_shutdown.engine.supervisor",
    "serve_frontend": "pytest_shutdown.engine.frontend",
    "REFERENCE_LEVELS": "pytest_shutdown.engine.frontend",
    "REFERENCE_PHASES": "pytest_shutdown.engine.frontend",
    "DISTRIBUTED_LEVELS": "pytest_shutdown.engine.distributed_tree",
    "DISTRIBUTED_PHASES": "pytest_shutdown.engine.distributed_tree",
    "distributed_matrix_config": "pytest_shutdown.engine.distributed_tree",
    "serve_ranks": "pytest_shutdown.engine.rank_launcher",
    "RankFaults": "pytest_shutdown.engine.rank_launcher",
    "RANK_LEVELS": "pytest_shutdown.engine.rank_launcher",
    "RayEngine": "pytest_shutdown.engine.ray_engine",
    "RayFaults": "pytest_shutdown.engine.ray_engine",
    "AsyncLLM": "pytest_shutdown.engine.async_llm",
    "AsyncFaults": "pytest_shutdown.engine.async_llm",
    "AsyncRequestOutput": "pytest_shutdown.engine.async_llm",
    "EngineDeadError": "pytest_shutdown.engine.async_llm",
    "serve_async_frontend": "pytest_shutdown.engine.async_frontend",
    "ASYNC_LEVELS": "pytest_shutdown.engine.async_frontend",
    "ASYNC_PHASES": "pytest_shutdown.engine.async_frontend",
    "async_matrix_config": "pytest_shutdown.engine.async_frontend",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports('pytest_shutdown.engine', _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.engine.async_frontend import (
        ASYNC_LEVELS,
        ASYNC_PHASES,
        async_matrix_config,
        serve_async_frontend,
    )
    from pytest_shutdown.engine.async_llm import (
        AsyncFaults,
        AsyncLLM,
        AsyncRequestOutput,
        EngineDeadError,
    )
    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.engine.core import EngineCore, EngineShutdownState, FinishReason
    from pytest_shutdown.engine.core_proc import ChildFaults, run_engine_core
    from pytest_shutdown.engine.distributed import (
        GroupDeadlines,
        RankGroup,
        free_port,
        host_store,
        select_backend,
    )
    from pytest_shutdown.engine.distributed_tree import (
        DISTRIBUTED_LEVELS,
        DISTRIBUTED_PHASES,
        distributed_matrix_config,
    )
    from pytest_shutdown.engine.frontend import REFERENCE_LEVELS, REFERENCE_PHASES, serve_frontend
    from pytest_shutdown.engine.llm import ReferenceLLM, RequestOutput
    from pytest_shutdown.engine.processes import (
        EngineProcManager,
        EngineStartupError,
        ProcessFailure,
        ShutdownOutcome,
        kill_process_tree,
        shutdown_processes,
    )
    from pytest_shutdown.engine.rank_launcher import RANK_LEVELS, RankFaults, serve_ranks
    from pytest_shutdown.engine.ray_engine import RayEngine, RayFaults
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.engine.start import helper_process_pids
    from pytest_shutdown.engine.supervisor import DPSupervisor
    from pytest_shutdown.engine.timeouts import (
        ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S,
        get_engine_process_shutdown_timeout,
    )
    from pytest_shutdown.gpu.forking import ForkRefusedError
