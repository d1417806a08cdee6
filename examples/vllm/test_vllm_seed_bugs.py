"""The seed bugs of the two vLLM reviews, put back into vLLM's own classes: each is caught.

Each subclass undoes one fix the reviews asked for (or, for the async client, one fix vLLM
made); everything else is vLLM 0.33.0's code. The checks are the one-liners of
``test_vllm_shutdown.py`` and the probes of ``test_vllm_async_client.py``, unchanged.
"""

from __future__ import annotations

import asyncio
import importlib.util
import weakref
from contextlib import ExitStack
from unittest import mock

import pytest

_VLLM = importlib.util.find_spec("vllm")
if _VLLM is None or _VLLM.origin in (None, "namespace"):  # this folder is not vLLM
    pytest.skip(
        "vllm is not installed here: `make vllm-check` runs these tests in a side venv",
        allow_module_level=True,
    )

import vllm.v1.engine.core_client as core_client_module  # noqa: E402 - after the skip
from client_probes import (  # noqa: E402
    close_open_sockets,
    open_socket_types,
    shut_down_client,
    started_client,
    term_within,
)
from model_free import (  # noqa: E402 - after the skip: model_free imports vllm
    TextRenderer,
    make_mm_renderer,
    make_renderer,
    model_free_engines,
    on_platform,
    vllm_config,
)
from vllm.v1.engine import utils as engine_utils  # noqa: E402
from vllm.v1.engine.core_client import BackgroundResources  # noqa: E402
from vllm.v1.engine.utils import CoreEngineProcManager  # noqa: E402
from vllm.v1.executor import UniProcExecutor  # noqa: E402

from pytest_shutdown import (  # noqa: E402
    ShutdownContractError,
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
    assert_timeout_decoupling,
    timeout_passed_to,
)


class ManagerWithoutDetachGuard(CoreEngineProcManager):
    """The reaper runs on every shutdown(), also after the finalizer already ran."""

    def shutdown(self, timeout: float | None = None) -> None:
        self.manager_stopped.set()
        self._finalizer.detach()
        engine_utils.shutdown(self.processes, timeout=timeout)


class ManagerIgnoringThePolicy(CoreEngineProcManager):
    """The caller's timeout reaches the reaper unchanged: ROCm loses its cleanup window."""

    def shutdown(self, timeout: float | None = None) -> None:
        self.manager_stopped.set()
        if self._finalizer.detach() is not None:
            engine_utils.shutdown(self.processes, timeout=timeout)


def manager(kind: type[CoreEngineProcManager], engines: int, request: int = 0) -> object:
    with model_free_engines(), on_platform("cpu"):
        return kind(
            local_engine_count=engines,
            start_index=0,
            local_start_index=0,
            vllm_config=vllm_config(request),
            local_client=True,
            handshake_address="ipc:///nonexistent/model-free",
            executor_class=UniProcExecutor,
            log_stats=False,
        )


@pytest.mark.exercises("vllm.v1.engine.utils.CoreEngineProcManager (no detach guard)")
def test_a_manager_without_the_detach_guard_is_cleanup_repeated() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(manager(ManagerWithoutDetachGuard, engines=0))
    assert exc.value.codes == ["cleanup-repeated"]
    assert exc.value.findings[0].details["cleanup"] == "vllm.v1.utils.shutdown"


@pytest.mark.exercises("vllm.v1.engine.utils.CoreEngineProcManager (policy ignored)")
def test_a_manager_ignoring_the_policy_is_timeout_policy() -> None:
    def budget(request: float | None, process: float | None) -> None:
        manager(ManagerIgnoringThePolicy, 0, request).shutdown(process)  # type: ignore[arg-type,attr-defined]

    spy = timeout_passed_to("vllm.v1.engine.utils:shutdown", budget)
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(spy, grace=15.0, platform=on_platform, request=(0, 7))
    assert {f.details["cell"] for f in exc.value.findings} == {"rocm-req0-proc0"}


class RendererEnteringItsExecutor(TextRenderer):
    """``enter_context(executor)``: the ExitStack closes the pool with shutdown(wait=True)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._finalizer.detach()
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._resources.enter_context(self._executor)
        self._resources.callback(self._mm_executor.shutdown, wait=False)


class RendererFinalizingWithItsOwnMethod(TextRenderer):
    """``weakref.finalize(self, self.shutdown)``: the finalizer keeps the renderer alive."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self.shutdown)


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer (enter_context(executor))")
def test_a_renderer_closing_its_pool_with_wait_is_blocking_close() -> None:
    renderer = make_renderer(kind=RendererEnteringItsExecutor)
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(renderer, budget=0.3)
    assert exc.value.codes == ["blocking-close"]


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer (finalize(self, self.shutdown))")
def test_a_renderer_finalizing_with_its_own_method_is_never_collected() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(lambda: make_renderer(kind=RendererFinalizingWithItsOwnMethod))
    assert exc.value.codes == ["finalizer-bound-method"]


class RendererClosingItsCacheBesidesTheStack(TextRenderer):
    """The seed's bug: ``shutdown()`` closes the processor cache itself, and the ExitStack, which
    has its ``close`` registered, closes it again: twice in the first call."""

    def shutdown(self) -> None:
        self._join_mm_warmup()
        if self._mm_processor_cache is not None:
            self._mm_processor_cache.close()
        self._resources.close()


class RendererClosingItsCacheOnEveryCall(TextRenderer):
    """The seed's bug, second form: the ExitStack is closed once, but the explicit close of the
    processor cache after it is unguarded: every later (or racing) shutdown closes it again."""

    def shutdown(self) -> None:
        self._join_mm_warmup()
        self._resources.close()
        if self._mm_processor_cache is not None:
            self._mm_processor_cache.close()


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer (cache closed beside the ExitStack)")
def test_a_renderer_closing_its_processor_cache_twice_is_cleanup_repeated() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(make_mm_renderer(kind=RendererClosingItsCacheBesidesTheStack))
    assert set(exc.value.codes) == {"cleanup-repeated"}
    assert all("cache" in f.details["cleanup"] for f in exc.value.findings)


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer (unguarded cache close, racing)")
def test_a_renderer_closing_its_processor_cache_on_every_call_is_cleanup_repeated() -> None:
    renderer = make_mm_renderer(kind=RendererClosingItsCacheOnEveryCall)
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(renderer, calls=2, threads=4)
    assert set(exc.value.codes) == {"cleanup-repeated"}
    assert all("cache" in f.details["cleanup"] for f in exc.value.findings)


class ResourcesLeavingTheSocketsOpen(BackgroundResources):
    """Shutdown cancels the output task but closes no socket: ``zmq.Context.term()`` then blocks
    for as long as they are open (vLLM PR #13298 closes them, with linger 0, before)."""

    def __call__(self) -> None:
        with mock.patch.object(core_client_module, "close_sockets", lambda sockets: None):
            super().__call__()


class ResourcesSkippingTheSocketsOnAClosedLoop(BackgroundResources):
    """Once the output task's loop is closed, the sockets are left open (vLLM PR #57757 closes
    them directly then)."""

    def __call__(self) -> None:
        task = self.output_queue_task
        if task is None or not task.get_loop().is_closed():
            super().__call__()
            return
        with mock.patch.object(core_client_module, "close_sockets", lambda sockets: None):
            super().__call__()


#: How long the probe waits for a ``term()`` that must block.
TERM_PROBE_S = 1.0


@pytest.mark.exercises("vllm.v1.engine.core_client.BackgroundResources (sockets left open)")
def test_a_client_leaving_its_sockets_open_cannot_terminate_its_context() -> None:
    client = asyncio.run(shut_down_client(ResourcesLeavingTheSocketsOpen))
    try:
        assert open_socket_types(client) == ["PULL", "ROUTER"]
        assert not term_within(client.resources.ctx, TERM_PROBE_S)
    finally:
        close_open_sockets(client)  # the blocked term() returns, its thread ends


@pytest.mark.allow_leaks(
    asyncio=True,
    reason="the scenario: the client's loop ends before its shutdown, so asyncio.run cancels "
    "the output queue task the client left pending (the guard's task-leak)",
)
@pytest.mark.exercises("vllm.v1.engine.core_client.BackgroundResources (closed loop skipped)")
def test_a_client_skipping_cleanup_on_a_closed_loop_leaves_its_sockets_open() -> None:
    client = asyncio.run(started_client(ResourcesSkippingTheSocketsOnAClosedLoop))
    client.shutdown()
    try:
        assert open_socket_types(client) == ["PULL", "ROUTER"]
    finally:
        close_open_sockets(client)
