"""The helpers on vLLM's own classes, one line per check, as vLLM's own tests would hold them.

Runs when ``vllm`` is importable (``make vllm-check`` builds a side venv with the vllm 0.33.0
wheel); skipped with the reason otherwise. The shutdown logic under test is vLLM's: its renderer,
its ``CoreEngineProcManager`` with real EngineCore processes in ``run_engine_core``, its timeout
policy and its DP supervisor. ``model_free`` replaces only what needs a model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest

_VLLM = importlib.util.find_spec("vllm")
if _VLLM is None or _VLLM.origin in (None, "namespace"):  # this folder is not vLLM
    pytest.skip(
        "vllm is not installed here: `make vllm-check` runs these tests in a side venv",
        allow_module_level=True,
    )

from model_free import (  # noqa: E402 - after the skip: model_free imports vllm
    make_manager,
    make_mm_renderer,
    make_renderer,
    on_platform,
    run_engine_core,
    supervisor_args,
    vllm_config,
)
from vllm.entrypoints.launchers.dp_supervisor import CHILD_EXIT_GRACE_S, DPSupervisor  # noqa: E402
from vllm.v1.engine.utils import (  # noqa: E402
    ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S,
    get_engine_process_shutdown_timeout,
)

from pytest_shutdown import (  # noqa: E402
    FreezeScenario,
    assert_finalizers_ok,
    assert_finalizes_on_gc,
    assert_freeze_policy,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
    assert_not_force_killed,
    assert_timeout_decoupling,
    timeout_passed_to,
)
from pytest_shutdown.harness import outcome_from_processes, zero_window_override  # noqa: E402

GRACE = ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S


# -- vllm/renderers/base.py: BaseRenderer ---------------------------------------------------------


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer.shutdown")
def test_renderer_shutdown_is_idempotent() -> None:
    assert_idempotent_shutdown(make_renderer())


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer._finalizer")
def test_renderer_finalizer_does_not_keep_it_alive() -> None:
    assert_finalizers_ok(make_renderer())
    assert_finalizes_on_gc(make_renderer)


@pytest.mark.exercises("vllm.renderers.base._SwappableExecutor")
def test_renderer_shutdown_does_not_wait_for_busy_pools() -> None:
    assert_nonblocking_shutdown(make_renderer(), budget=0.5)


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer.shutdown (multimodal processor cache)")
def test_mm_renderer_closes_its_processor_cache_once() -> None:
    renderer = make_mm_renderer()
    report = assert_idempotent_shutdown(renderer, calls=3, threads=4)
    closes = {k: v for k, v in report.cleanups.items() if "processor" in k and "cache" in k}
    assert len(closes) == 2, report.cleanups  # the sender cache and the processor-only cache
    assert all(counts["call 1"] == 1 for counts in closes.values()), closes


@pytest.mark.exercises("vllm.renderers.base.BaseRenderer._finalizer (multimodal processor cache)")
def test_mm_renderer_is_finalized_with_its_processor_cache() -> None:
    report = assert_finalizes_on_gc(make_mm_renderer)
    assert any("processor" in label and "cache" in label for label in report.performed("gc"))


# -- vllm/v1/engine/utils.py: the timeout policy and CoreEngineProcManager ------------------------


@pytest.mark.exercises("vllm.v1.engine.utils.get_engine_process_shutdown_timeout")
def test_timeout_policy() -> None:
    policy = get_engine_process_shutdown_timeout
    assert_timeout_decoupling(policy, grace=GRACE, platform=on_platform)


@pytest.mark.exercises("vllm.v1.engine.utils.get_engine_process_shutdown_timeout")
def test_timeout_policy_with_the_window_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "3")
    assert_timeout_decoupling(
        get_engine_process_shutdown_timeout,
        grace=GRACE,
        platform=on_platform,
        expected=zero_window_override(3.0),
    )


def manager_budget(request: float | None, process: float | None) -> None:
    make_manager(engines=0, shutdown_timeout=request).shutdown(process)  # type: ignore[arg-type]


@pytest.mark.exercises("vllm.v1.engine.utils.CoreEngineProcManager.shutdown")
def test_manager_passes_the_policy_budget_to_the_reaper() -> None:
    budget = timeout_passed_to("vllm.v1.engine.utils:shutdown", manager_budget)
    # VllmConfig.shutdown_timeout is a whole number of seconds, never None
    assert_timeout_decoupling(budget, grace=GRACE, platform=on_platform, request=(0, 7))


@pytest.mark.exercises("vllm.v1.engine.utils.CoreEngineProcManager + vllm.v1.utils.shutdown")
def test_manager_shutdown_is_idempotent() -> None:
    assert_idempotent_shutdown(make_manager(engines=2))


@pytest.mark.exercises("vllm.v1.engine.utils.CoreEngineProcManager._finalizer")
def test_manager_is_collected_and_reaps_its_engines() -> None:
    assert_finalizes_on_gc(lambda: make_manager(engines=1))


@pytest.mark.exercises("vllm.v1.engine.core.EngineCoreProc.run_engine_core (SIGTERM)")
def test_engines_exit_on_sigterm_without_a_force_kill() -> None:
    manager = make_manager(engines=2)
    started = time.monotonic()
    manager.shutdown(timeout=30.0)
    outcome = outcome_from_processes(manager.processes, timeout=30.0, started=started)
    assert_not_force_killed(outcome)


# -- vllm/v1/engine/core.py: EngineCoreProc.run_engine_core ---------------------------------------


def engine_exit(scenario: FreezeScenario) -> None:
    with on_platform(scenario.platform):
        run_engine_core(
            vllm_config=vllm_config(scenario.shutdown_timeout),
            scenario_exit=scenario.exit,
            request_shutdown=True,
        )


@pytest.mark.exercises("vllm.v1.engine.core.EngineCoreProc.run_engine_core (gc.freeze)")
def test_run_engine_core_freezes_only_on_a_clean_rocm_abort() -> None:
    assert_freeze_policy(engine_exit, start_method="fork")


# -- vllm/entrypoints/launchers/dp_supervisor.py: DPSupervisor ------------------------------------


def supervisor_wait(request: float | None, process: float | None) -> None:
    asyncio.run(DPSupervisor(supervisor_args(request))._shutdown_children())  # type: ignore[arg-type]


@pytest.mark.exercises("vllm.entrypoints.launchers.dp_supervisor.DPSupervisor")
def test_supervisor_waits_the_policy_plus_the_child_grace() -> None:
    wait = timeout_passed_to(
        "vllm.entrypoints.launchers.dp_supervisor:_join_processes_with_timeout", supervisor_wait
    )
    assert_timeout_decoupling(
        wait,
        grace=GRACE,
        platform=on_platform,
        shape="diagonal",
        include_none=False,
        offset=CHILD_EXIT_GRACE_S,
    )
