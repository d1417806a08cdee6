"""What vLLM needs a model for, replaced; everything about shutdown stays vLLM's own.

* :class:`TextRenderer`: vLLM's ``BaseRenderer`` with its one abstract method filled in, built
  from a text-only model config (no tokenizer, no multimodal processor): the ExitStack, the
  finalizer, the ``_SwappableExecutor`` and the multimodal pool are vLLM's.
* :func:`make_mm_renderer`: the same renderer for a multimodal model, whose processor (the one
  thing that needs the model's files) is a stand-in. vLLM's own ``__init__`` then builds the
  multimodal processor caches with ``processor_cache_from_config`` (vLLM's
  ``LruKeyReplicatedSenderCache`` and ``MultiModalProcessorOnlyCache``) and registers their
  ``close`` on the renderer's ExitStack: what the seed's ``shutdown()`` closed twice.
* :class:`NoModelEngineCore`: what ``EngineCore.__init__`` builds from a model (executor, KV
  caches, scheduler), replaced by an empty scheduler and no executor.
* :class:`ModelFreeEngineCore`: vLLM's ``EngineCoreProc`` with its constructor replaced (no
  model, no executor, no ZMQ sockets) and an empty scheduler. Its busy loop, shutdown-state
  handling, client-request dispatch, and above all ``EngineCoreProc.run_engine_core`` (signal
  handlers, the wakeup callback, the clean-exit decision and the ROCm ``gc.freeze()``) are
  vLLM's. :func:`model_free_engines` makes vLLM's ``CoreEngineProcManager`` start it.
* :class:`ConnectedEngineCore`: vLLM's whole ``EngineCoreProc.__init__`` (the startup handshake,
  the input and output socket threads) on a :class:`NoModelEngineCore`: a real EngineCore
  process that vLLM's own ``AsyncMPClient`` talks to (:func:`make_async_client`,
  :func:`serve_until_killed`).
* :func:`on_platform`: makes vLLM's ``current_platform`` report CUDA or ROCm (its own
  ``is_rocm()`` / ``is_cuda()`` read the patched platform enum).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import queue
import time
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import vllm.renderers.base as renderer_module
import vllm.v1.engine.core as engine_core_module
import vllm.v1.engine.core_client as core_client_module
from vllm.config import (
    DeviceConfig,
    MultiModalConfig,
    ObservabilityConfig,
    ParallelConfig,
    VllmConfig,
)
from vllm.platforms import current_platform
from vllm.platforms.interface import PlatformEnum
from vllm.renderers.base import BaseRenderer
from vllm.v1.engine.core import EngineCore, EngineCoreProc, EngineShutdownState
from vllm.v1.engine.core_client import AsyncMPClient, BackgroundResources
from vllm.v1.engine.utils import CoreEngineProcManager
from vllm.v1.executor import UniProcExecutor

from pytest_shutdown.orphans import report_phase

#: How long a front end killed by a test waits on its loop (it is killed long before).
SERVE_S = 600.0
#: The context length the stand-in model config declares.
MAX_MODEL_LEN = 2048
#: How long a model-free engine may take to reach its busy loop.
START_DEADLINE_S = 60.0
#: Released by each forked engine once vLLM's signal handlers are installed.
_started = multiprocessing.get_context("fork").Semaphore(0)

_PLATFORMS = {"cuda": PlatformEnum.CUDA, "rocm": PlatformEnum.ROCM, "cpu": PlatformEnum.CPU}


@contextlib.contextmanager
def on_platform(name: str) -> Iterator[None]:
    """The ``platform=`` hook: vLLM's ``current_platform`` believes it is ``name``."""
    with mock.patch.object(current_platform, "_enum", _PLATFORMS[name]):
        yield


def vllm_config(shutdown_timeout: float = 0) -> VllmConfig:
    """A real ``VllmConfig`` for the CPU, with the request-drain budget under test.

    Its model config is a stand-in with what the engine processes and their client read of it:
    "not a mixture of experts" (what a DP rank asks), text only, and the figures of the engine's
    ready message (its context length, dtype, no sleep mode).
    """
    device = DeviceConfig(device="cpu")
    config = VllmConfig(device_config=device, shutdown_timeout=shutdown_timeout)
    config.model_config = types.SimpleNamespace(  # type: ignore[assignment]
        is_moe=False,
        multimodal_config=None,
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        enable_sleep_mode=False,
    )
    return config


# -- the renderer ---------------------------------------------------------------------------------


class TextRenderer(BaseRenderer[Any]):
    """``BaseRenderer`` for a text-only model without a tokenizer."""

    def render_messages(self, messages: Any, params: Any) -> Any:
        raise NotImplementedError("no chat template without a model")


def make_renderer(workers: int = 2, kind: type[TextRenderer] = TextRenderer) -> TextRenderer:
    """A renderer of a text-only model without a tokenizer (the model config is a stand-in)."""
    model_config = types.SimpleNamespace(
        renderer_num_workers=workers, supports_multimodal_inputs=False, multimodal_config=None
    )
    config = types.SimpleNamespace(model_config=model_config, parallel_config=ParallelConfig())
    return kind(config, None)  # type: ignore[arg-type]


class StandInProcessor:
    """What ``mm_registry.create_processor`` returns for a real model: here, nothing to run."""

    def __repr__(self) -> str:
        return "StandInProcessor()"


#: A small processor cache (the default is 4 GiB); the cache classes are vLLM's.
MM_CACHE_GB = 0.01


def make_mm_renderer(
    workers: int = 2, kind: type[TextRenderer] = TextRenderer
) -> TextRenderer:
    """A renderer of a multimodal model, with vLLM's multimodal processor caches.

    The model config is a stand-in that supports multimodal inputs with a real
    ``MultiModalConfig``; ``create_processor`` (it would load the model's processor) returns a
    :class:`StandInProcessor`. Everything else of ``BaseRenderer.__init__`` runs as in vLLM.
    """
    mm_config = MultiModalConfig(mm_processor_cache_gb=MM_CACHE_GB)
    model_config = types.SimpleNamespace(
        renderer_num_workers=workers,
        supports_multimodal_inputs=True,
        multimodal_config=None,  # no frontend GPU decoding pool to install
        get_multimodal_config=lambda: mm_config,
    )
    config = types.SimpleNamespace(
        model_config=model_config,
        parallel_config=ParallelConfig(),
        observability_config=ObservabilityConfig(),
    )
    stand_in = StandInProcessor()
    with mock.patch.object(
        renderer_module.mm_registry, "create_processor", lambda *a, **k: stand_in
    ):
        renderer = kind(config, None)  # type: ignore[arg-type]
    assert renderer.mm_processor_cache is not None, "vLLM built no processor cache"
    return renderer


# -- the engine core ------------------------------------------------------------------------------


class EmptyScheduler:
    """A scheduler with no requests (requests need a model)."""

    def has_requests(self) -> bool:
        return False

    def get_num_unfinished_requests(self) -> int:
        return 0

    def finish_requests(self, request_ids: Any, status: Any) -> list[Any]:
        return []

    def get_request_counts(self) -> tuple[int, int]:
        return (0, 0)

    def get_kv_event_publisher_config(self) -> None:
        return None

    def shutdown(self) -> None:
        pass


class NoModelEngineCore(EngineCore):
    """What ``EngineCore.__init__`` builds from a model (the executor, the KV caches, the
    scheduler), replaced by an empty scheduler and no executor; the engine's own state
    (queues, idle callbacks, weight version) is set as vLLM sets it. ``EngineCoreProc.__init__``
    calls this as its ``super().__init__`` when it comes after ``EngineCoreProc`` in the MRO.
    """

    def __init__(self, vllm_config: VllmConfig, *args: Any, **kwargs: Any) -> None:
        self.vllm_config = vllm_config
        self.log_stats = False
        self._weight_version = "default"
        self.scheduler = EmptyScheduler()
        self.model_executor = None
        self.structured_output_manager = types.SimpleNamespace(clear_backend=lambda: None)
        self.batch_queue = None
        self.aborts_queue: queue.Queue[Any] = queue.Queue()
        self._idle_state_callbacks: list[Any] = []

    def step_fn(self) -> tuple[dict[int, Any], bool]:  # type: ignore[override]
        return {}, False

    def post_step(self, model_executed: bool) -> None:
        pass

    def shutdown(self) -> None:
        # EngineCore.shutdown tears down the model executor, the scheduler and torch.distributed;
        # none exist here. Its unfreeze of the startup heap is kept.
        self.scheduler.shutdown()
        gc.unfreeze()


class ModelFreeEngineCore(EngineCoreProc, NoModelEngineCore):
    """``EngineCoreProc`` without a model: vLLM's busy loop and shutdown handling on no work.

    ``scenario_exit="error"`` makes the first engine step raise (an engine crash);
    ``request_shutdown=True`` sends the process its own SIGTERM once the loop runs, the way
    ``CoreEngineProcManager.shutdown`` would.
    """

    def __init__(
        self,
        *args: Any,
        vllm_config: VllmConfig,
        engine_index: int = 0,
        scenario_exit: str = "clean",
        request_shutdown: bool = False,
        **kwargs: Any,
    ) -> None:
        NoModelEngineCore.__init__(self, vllm_config)
        self.engine_index = engine_index
        self.shutdown_state = EngineShutdownState.RUNNING
        self.engines_running = False
        self.input_queue: queue.Queue[Any] = queue.Queue()
        self.output_queue: queue.Queue[Any] = queue.Queue()
        self.process_input_queue_block = True
        self.publish_dp_lb_stats = False
        self._scenario_exit = scenario_exit
        self._request_shutdown = request_shutdown
        _started.release()  # run_engine_core installed its signal handlers before building us

    def run_busy_loop(self) -> None:
        if self._scenario_exit == "error":
            raise RuntimeError("model-free engine: simulated engine failure")
        if self._request_shutdown:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
        super().run_busy_loop()

    def _send_engine_dead(self) -> None:
        pass


class ConnectedEngineCore(EngineCoreProc, NoModelEngineCore):
    """vLLM's whole ``EngineCoreProc.__init__`` without a model: the startup handshake with the
    client, the input and output socket threads on real ZMQ sockets, the ready message; then
    vLLM's busy loop, which answers utility calls (``get_weight_version``...) on no work.

    The one step skipped: ``VllmConfig.__post_init__`` after the handshake re-validates the
    model's config (its architecture, its parallel layout) and there is no model to validate.
    """

    def __init__(self, vllm_config: VllmConfig, *args: Any, **kwargs: Any) -> None:
        with mock.patch.object(VllmConfig, "__post_init__", lambda config: None):
            super().__init__(vllm_config, *args, **kwargs)


@contextlib.contextmanager
def model_free_engines(kind: type[EngineCoreProc] = ModelFreeEngineCore) -> Iterator[None]:
    """``run_engine_core`` (also in managers started inside) builds ``kind``."""
    with mock.patch.object(engine_core_module, "EngineCoreProc", kind):
        yield


def run_engine_core(**kwargs: Any) -> None:
    """vLLM's ``EngineCoreProc.run_engine_core`` on a model-free engine."""
    with model_free_engines():
        ModelFreeEngineCore.run_engine_core(**kwargs)


def make_manager(engines: int = 1, shutdown_timeout: float = 0) -> CoreEngineProcManager:
    """vLLM's ``CoreEngineProcManager`` running ``engines`` real model-free EngineCore processes
    (forked), each in vLLM's ``run_engine_core``; waits until each has entered its busy loop.

    The manager is built on the CPU platform (this machine's), whatever platform a test makes
    current around it: starting processes on a ROCm platform would ask torch for HIP devices.
    """
    with model_free_engines(), on_platform("cpu"):
        manager = CoreEngineProcManager(
            local_engine_count=engines,
            start_index=0,
            local_start_index=0,
            vllm_config=vllm_config(shutdown_timeout),
            local_client=True,
            handshake_address="ipc:///nonexistent/model-free",
            executor_class=UniProcExecutor,
            log_stats=False,
        )
    deadline = time.monotonic() + START_DEADLINE_S
    waiting = engines
    while waiting:
        if _started.acquire(timeout=0.05):
            waiting -= 1
        elif manager.finished_procs() or time.monotonic() > deadline:
            manager.shutdown(timeout=5.0)
            raise RuntimeError(f"model-free EngineCores did not start: {manager.finished_procs()}")
    return manager


# -- the DP supervisor ----------------------------------------------------------------------------


def supervisor_args(shutdown_timeout: float) -> argparse.Namespace:
    """Command-line arguments a DP supervisor accepts: 2 local ranks, ports 8000-8001."""
    return argparse.Namespace(
        grpc=False,
        uds=None,
        ssl_keyfile=None,
        ssl_certfile=None,
        api_server_count=1,
        data_parallel_rank=None,
        data_parallel_external_lb=False,
        data_parallel_hybrid_lb=False,
        data_parallel_size=2,
        data_parallel_size_local=2,
        data_parallel_start_rank=0,
        data_parallel_supervisor_port=8100,
        port=8000,
        shutdown_timeout=shutdown_timeout,
    )


# -- the async client -----------------------------------------------------------------------------


def make_async_client(
    resources: type[BackgroundResources] = BackgroundResources,
) -> AsyncMPClient:
    """vLLM's ``AsyncMPClient`` as ``AsyncLLM`` builds it for one engine: it binds its ZMQ
    sockets, starts a real :class:`ConnectedEngineCore` process through vLLM's
    ``launch_core_engines`` and ``CoreEngineProcManager``, completes vLLM's startup handshake and
    waits for the engine's ready message. Called on a running loop, it also starts its output
    queue task there (else on its first awaited call). ``resources``: the class of its
    finalizer (a seed bug's subclass of vLLM's ``BackgroundResources``).
    """
    with (
        model_free_engines(ConnectedEngineCore),
        on_platform("cpu"),
        mock.patch.object(core_client_module, "BackgroundResources", resources),
    ):
        return AsyncMPClient(
            vllm_config=vllm_config(), executor_class=UniProcExecutor, log_stats=False
        )


def serve_until_killed() -> None:
    """A front end's process: an ``AsyncMPClient`` on its loop with one model-free EngineCore,
    one utility call answered, then phase ``ready`` reported and the loop kept waiting (for
    :func:`pytest_shutdown.kill_tree_at`)."""

    async def serve() -> None:
        client = make_async_client()
        await client.get_weight_version_async()
        report_phase("ready")
        await asyncio.sleep(SERVE_S)

    asyncio.run(serve())
