"""The helpers on real engine patterns (vLLM 0.33.0's, copied in ``vllm_patterns``): one line per
check, and each seed bug put back is caught with the right code."""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import vllm_patterns as v

from pytest_shutdown import (
    FreezeScenario,
    ShutdownContractError,
    assert_finalizes_on_gc,
    assert_freeze_policy,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
    assert_not_force_killed,
    assert_timeout_decoupling,
    timeout_matrix,
    timeout_passed_to,
)
from pytest_shutdown.harness import freeze_scenarios, outcome_from_processes, zero_window_override
from pytest_shutdown.helpers.idempotence import NothingCountedError
from pytest_shutdown.helpers.spies import NotCalledError


def _wrong_cells(exc: pytest.ExceptionInfo[ShutdownContractError]) -> set[str]:
    assert set(exc.value.codes) == {"timeout-policy"}
    return {f.details["cell"] for f in exc.value.findings}


# -- 1. timeout policies as real code has them ----------------------------------------------------


def test_a_two_argument_policy_reads_its_platform_through_the_hook() -> None:
    report = assert_timeout_decoupling(
        v.get_engine_process_shutdown_timeout, grace=15.0, platform=v.on_platform
    )
    assert "rocm-req0-proc0" in report.details["cells"]
    assert v.current_platform.name == "cuda"  # the hook restored it


@pytest.mark.parametrize(
    ("policy", "wrong"),
    [
        (v.policy_ignoring_the_platform, {"cuda-req0-proc0"}),
        (v.policy_regracing_a_spent_budget, {"rocm-reqNone-proc0", "rocm-req7-proc0"}),
    ],
)
def test_a_two_argument_seed_bug_is_a_wrong_cell(policy: Any, wrong: set[str]) -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy, grace=15.0, platform=v.on_platform)
    assert _wrong_cells(exc) == wrong


def test_a_two_argument_policy_without_the_hook_is_told_about_platform() -> None:
    with pytest.raises(ValueError, match="platform="):
        assert_timeout_decoupling(v.get_engine_process_shutdown_timeout, grace=15.0)


def test_a_documented_override_is_not_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(v.ENV_WINDOW, "3")
    policy = v.get_engine_process_shutdown_timeout
    with pytest.raises(ShutdownContractError) as exc:  # without expected=: both 0/0 cells differ
        assert_timeout_decoupling(policy, grace=15.0, platform=v.on_platform)
    assert _wrong_cells(exc) == {"cuda-req0-proc0", "rocm-req0-proc0"}
    assert_timeout_decoupling(
        policy, grace=15.0, platform=v.on_platform, expected=zero_window_override(3.0)
    )
    # the override is checked too: a policy that ignores the variable is caught on CUDA
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(
            v.policy_ignoring_the_platform,
            grace=15.0,
            platform=v.on_platform,
            expected=zero_window_override(3.0),
        )
    assert _wrong_cells(exc) == {"cuda-req0-proc0", "rocm-req0-proc0"}


def test_expected_may_be_any_function_of_the_cell() -> None:
    cells = timeout_matrix(
        expected=lambda cell: 1.0 if cell.process_timeout is None else cell.expected
    )
    assert {c.expected for c in cells if c.process_timeout is None} == {1.0}
    with pytest.raises(ValueError, match="expected"):
        timeout_matrix(expected=3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected"):
        timeout_matrix(expected=lambda cell: -1.0)


def test_diagonal_shape_without_none_and_an_offset() -> None:
    cells = timeout_matrix(shape="diagonal", include_none=False, offset=5.0)
    assert cells.ids == [
        "cuda-req0-proc0", "cuda-req7-proc7", "rocm-req0-proc0", "rocm-req7-proc7"
    ]
    assert [c.expected for c in cells] == [5.0, 12.0, 20.0, 12.0]
    with pytest.raises(ValueError, match="shape"):
        timeout_matrix(shape="triangle")
    with pytest.raises(ValueError, match="include_none"):
        timeout_matrix(request=(None,), include_none=False)
    with pytest.raises(ValueError, match="offset"):
        timeout_matrix(offset=float("nan"))


def _supervisor_wait(supervisor: type[v.DPSupervisor]) -> Any:
    return timeout_passed_to(
        (v, "_join_processes_with_timeout"),
        lambda request, process: supervisor(request).shutdown_children(),  # type: ignore[arg-type]
    )


def _assert_supervisor_decoupled(supervisor: type[v.DPSupervisor]) -> Any:
    """The supervisor waits the policy plus the child grace, on the diagonal cells."""
    return assert_timeout_decoupling(
        _supervisor_wait(supervisor),
        grace=15.0,
        platform=v.on_platform,
        shape="diagonal",
        include_none=False,
        offset=v.CHILD_EXIT_GRACE_S,
    )


def test_the_supervisor_waits_the_policy_plus_the_child_grace() -> None:
    report = _assert_supervisor_decoupled(v.DPSupervisor)
    assert report.details["cells"] == timeout_matrix(shape="diagonal", include_none=False).ids


def test_a_supervisor_without_the_child_grace_is_caught() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        _assert_supervisor_decoupled(v.SupervisorWithoutChildGrace)
    assert _wrong_cells(exc) == {
        "cuda-req0-proc0", "cuda-req7-proc7", "rocm-req0-proc0", "rocm-req7-proc7"
    }


def _manager_budget(manager: type[v.CoreEngineProcManager]) -> Any:
    return timeout_passed_to(
        "vllm_patterns:shutdown", lambda request, process: manager(request).shutdown(process)
    )


def test_the_budget_a_manager_really_passes_follows_the_policy() -> None:
    assert_timeout_decoupling(
        _manager_budget(v.CoreEngineProcManager), grace=15.0, platform=v.on_platform
    )
    assert v.shutdown.__module__ == "vllm_patterns"  # the spy is gone again


def test_a_manager_that_ignores_the_policy_is_caught() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(
            _manager_budget(v.ManagerIgnoringThePolicy), grace=15.0, platform=v.on_platform
        )
    assert _wrong_cells(exc) == {"rocm-req0-proc0"}


def test_a_call_that_never_reaches_the_spied_function_is_the_tests_error_once() -> None:
    policy = timeout_passed_to("vllm_patterns:shutdown", lambda request, process: None)
    with pytest.raises(NotCalledError, match="never reached vllm_patterns.shutdown"):
        assert_timeout_decoupling(policy, grace=15.0, platform=v.on_platform, platforms=("cuda",))


def test_a_call_that_skips_the_spied_function_in_some_cells_is_a_wrong_cell() -> None:
    def skips_the_reaper_at_zero(request: float | None, process: float | None) -> None:
        if process != 0:  # the bug: a zero budget skips the reaper instead of killing at once
            v.shutdown([], timeout=process)

    policy = timeout_passed_to("vllm_patterns:shutdown", skips_the_reaper_at_zero)
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy, grace=15.0, platform=v.on_platform, platforms=("cuda",))
    assert _wrong_cells(exc) == {"cuda-reqNone-proc0", "cuda-req0-proc0", "cuda-req7-proc0"}
    assert all("never reached" in f.details["error"] for f in exc.value.findings)


def test_the_spy_reads_a_positional_timeout_too() -> None:
    def positional(request: float | None, process: float | None) -> None:
        v.shutdown([], process)

    policy = timeout_passed_to("vllm_patterns:shutdown", positional)
    assert policy(0, 3.5) == 3.5
    assert policy(0, None) is None


@pytest.mark.parametrize(
    ("target", "kwargs", "names"),
    [
        ("vllm_patterns.shutdown", {}, "target"),
        ("vllm_patterns:no_such_function", {}, "target"),
        ("vllm_patterns:shutdown", {"argument": "deadline"}, "argument"),
    ],
)
def test_bad_spy_targets_name_the_argument(
    target: str, kwargs: dict[str, str], names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        timeout_passed_to(target, lambda request, process: None, **kwargs)


# -- 2. finalizers calling module-level functions -------------------------------------------------


def test_a_manager_with_a_module_function_finalizer_is_idempotent() -> None:
    manager = v.CoreEngineProcManager(0, engines=1)
    report = assert_idempotent_shutdown(manager)
    assert report.cleanups["vllm_patterns.shutdown"]["call 1"] == 1
    assert sum(report.cleanups["vllm_patterns.shutdown"].values()) == 1
    assert not any(p.is_alive() for p in manager.processes)


def test_a_manager_without_the_detach_guard_repeats_the_reaper() -> None:
    manager = v.ManagerWithoutDetachGuard(0, engines=1)
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(manager)  # no watch= needed
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-repeated"
    assert finding.details["cleanup"] == "vllm_patterns.shutdown"
    assert finding.details["counts"] == {"call 1": 1, "call 2": 1, "call 3": 1}


def test_a_collected_manager_runs_the_reaper_like_an_explicit_shutdown() -> None:
    report = assert_finalizes_on_gc(lambda: v.CoreEngineProcManager(0, engines=1))
    assert "vllm_patterns.shutdown" in report.details["explicit_cleanups"]


# -- 3. cleanups idempotent by contract -----------------------------------------------------------


class Tokenizer:
    """The README's sample: an owner of a pool, shut down with wait=False."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenizer")

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def test_the_readme_tokenizer_is_idempotent() -> None:
    report = assert_idempotent_shutdown(Tokenizer())
    assert report.cleanups["pool.shutdown"] == {"call 1": 1, "call 2": 1, "call 3": 1, "gc": 0}


def test_the_readme_sample_itself_is_idempotent() -> None:
    path = Path(__file__).resolve().parents[2] / "examples/third_party/test_pools_and_loaders.py"
    spec = importlib.util.spec_from_file_location("readme_pools_sample", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert_idempotent_shutdown(module.Tokenizer())


class Worker:
    """A thread, its stop event and a log file: every cleanup repeated on each shutdown."""

    def __init__(self, path: str) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stop.wait, args=(30.0,), name="worker")
        self.thread.start()
        self.log = open(path, "w")  # noqa: SIM115 - closed by shutdown

    def shutdown(self) -> None:
        self.stop.set()
        self.thread.join(10.0)
        self.log.close()


def test_join_set_and_close_repeated_are_harmless(tmp_path: Any) -> None:
    worker = Worker(str(tmp_path / "log"))
    report = assert_idempotent_shutdown(worker, watch=[worker.stop.set, worker.thread.join])
    assert report.cleanups["log.close"]["call 2"] == 1
    assert not worker.thread.is_alive()


class Connection:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:  # harmless to repeat, by this class's own contract
        self.closed += 1


class Client:
    def __init__(self) -> None:
        self.conn = Connection()

    def shutdown(self) -> None:
        self.conn.close()


def test_allow_repeat_declares_a_user_cleanup_idempotent() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(Client())
    assert exc.value.codes == ["cleanup-repeated"]
    assert_idempotent_shutdown(Client(), allow_repeat=["conn.close"])
    assert_idempotent_shutdown(Client(), allow_repeat=[Connection.close])


def release() -> None:
    """A module-level cleanup nothing leads to."""


class ReleasesSilently:
    def shutdown(self) -> None:
        release()


def test_an_object_already_shut_down_is_not_accused() -> None:
    renderer = v.Renderer(workers=1)
    renderer.shutdown()  # its ExitStack is spent: nothing left to run, nothing to count
    report = assert_idempotent_shutdown(renderer)
    assert all(sum(counts.values()) == 0 for counts in report.cleanups.values())


def test_counting_nothing_fails_and_names_watch() -> None:
    with pytest.raises(NothingCountedError, match="watch="):
        assert_idempotent_shutdown(ReleasesSilently())
    with pytest.raises(ShutdownContractError):
        assert_idempotent_shutdown(ReleasesSilently(), watch=[release])


# -- 4. the GC path calling the same function with the same arguments -----------------------------


def _stop(event: threading.Event, thread: threading.Thread) -> None:
    event.set()
    thread.join(10.0)


class Poller:
    """Explicit path ``stack.callback(_stop, ev, t)``, GC path ``finalize(self, _stop, ev, t)``."""

    def __init__(self) -> None:
        ev = threading.Event()
        t = threading.Thread(target=ev.wait, args=(30.0,), name="poller")
        t.start()
        self._stack = ExitStack()
        self._stack.callback(_stop, ev, t)
        self._finalizer = weakref.finalize(self, _stop, ev, t)

    def shutdown(self) -> None:
        self._finalizer.detach()
        self._stack.close()


def _stop_event_only(event: threading.Event) -> None:
    event.set()


class PollerStoppingLess(Poller):
    """Seed bug: the GC path sets the event but never joins the thread."""

    def __init__(self) -> None:
        super().__init__()
        _obj, _func, (ev, _t), _kwargs = self._finalizer.detach()  # type: ignore[misc]
        self._finalizer = weakref.finalize(self, _stop_event_only, ev)


def test_the_same_function_with_the_same_arguments_is_the_same_cleanup() -> None:
    report = assert_finalizes_on_gc(Poller)
    assert report.details["explicit_cleanups"] == [f"{__name__}._stop"]


def test_a_gc_path_doing_less_is_cleanup_missing() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(PollerStoppingLess)
    assert exc.value.codes == ["cleanup-missing"]
    assert exc.value.findings[0].details["cleanup"] == f"{__name__}._stop"


# -- 5. executors behind wrappers -----------------------------------------------------------------


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("swap-")}


def test_a_wrapped_pool_is_occupied_and_left_with_no_thread_behind() -> None:
    before = _pool_threads()
    renderer = v.Renderer(workers=2)
    report = assert_nonblocking_shutdown(renderer, budget=1.0)
    assert report.details["executors"] == ["_executor", "_mm_executor"]
    assert _pool_threads() - before == set()


def test_a_wrapper_closed_with_wait_true_blocks_and_still_leaves_nothing() -> None:
    before = _pool_threads()
    renderer = v.RendererEnteringTheWrapper(workers=2)
    with pytest.raises(ShutdownContractError) as exc:
        assert_nonblocking_shutdown(renderer, budget=0.3)
    assert exc.value.codes == ["blocking-close"]
    assert exc.value.findings[0].details["executors"] == ["_executor"]
    assert _pool_threads() - before == set()


def test_executors_by_label() -> None:
    renderer = v.Renderer(workers=1)
    report = assert_nonblocking_shutdown(
        renderer, executors={"tokenizer": renderer._executor}, budget=1.0
    )
    assert report.details["executors"] == ["tokenizer"]
    renderer._mm_executor.shutdown(wait=True)
    with pytest.raises(ValueError, match="executors"):
        assert_nonblocking_shutdown(renderer, executors="pool")  # type: ignore[arg-type]


# -- 6. outcomes of a shutdown that returns nothing -----------------------------------------------


def test_an_outcome_read_from_processes_that_exited() -> None:
    procs = v.start_engines(2)
    started = time.monotonic()
    assert v.shutdown(procs, timeout=10.0) is None
    outcome = outcome_from_processes(procs, timeout=10.0, started=started)
    assert outcome.exitcodes == {"EngineCore_DP0": 0, "EngineCore_DP1": 0}
    assert_not_force_killed(outcome)


def test_a_process_killed_at_the_deadline_is_force_killed() -> None:
    procs = v.start_engines(1, ignore_sigterm=True)
    started = time.monotonic()
    v.shutdown(procs, timeout=0.2)
    outcome = outcome_from_processes(procs, timeout=0.2, started=started)
    with pytest.raises(ShutdownContractError) as exc:
        assert_not_force_killed(outcome)
    assert exc.value.codes == ["force-killed"]
    assert outcome.force_killed == ["EngineCore_DP0"]
    assert_not_force_killed(outcome, expected=True)


def test_a_process_left_running_is_a_leak() -> None:
    procs = v.start_engines(1)
    outcome = outcome_from_processes(procs, timeout=0.0, started=time.monotonic(), reap_s=0.1)
    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_not_force_killed(outcome)
        assert exc.value.codes == ["process-leak"]
    finally:
        v.shutdown(procs, timeout=10.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "names"),
    [
        ("EngineCore", {"timeout": 1.0, "started": 0.0}, "procs"),
        ([object()], {"timeout": 1.0, "started": 0.0}, "procs\\[0\\]"),
        ([], {"timeout": -1.0, "started": 0.0}, "timeout"),
        ([], {"timeout": 1.0, "started": "now"}, "started"),
        ([], {"timeout": 1.0, "started": time.monotonic() + 3600}, "started"),
    ],
)
def test_bad_outcome_arguments_name_the_argument(
    args: Any, kwargs: dict[str, Any], names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        outcome_from_processes(args, **kwargs)


# -- 7. the gc.freeze rule ------------------------------------------------------------------------


def _run(entry: Any) -> Any:
    def target(scenario: FreezeScenario) -> None:
        entry(scenario.platform, scenario.shutdown_timeout, scenario.exit == "error")

    return target


def test_the_engine_entry_freezes_only_on_a_clean_rocm_abort() -> None:
    report = assert_freeze_policy(_run(v.run_engine_core), start_method="fork")
    facts = report.details["scenarios"]
    assert [sid for sid, f in facts.items() if f["frozen"]] == ["rocm-drain0-clean"]
    assert len(facts) == 8


@pytest.mark.parametrize(
    ("entry", "wrong"),
    [
        (v.run_engine_core_freezing_everywhere, {"cuda-drain0-clean"}),
        (v.run_engine_core_freezing_after_drain, {"rocm-drain5-clean"}),
    ],
)
def test_a_freeze_where_the_rule_forbids_it_is_caught(entry: Any, wrong: set[str]) -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_freeze_policy(_run(entry), start_method="fork")
    assert set(exc.value.codes) == {"gc-freeze-policy"}
    assert {f.details["scenario"] for f in exc.value.findings} == wrong


def test_a_missing_freeze_on_rocm_is_caught() -> None:
    def never_freezes(scenario: FreezeScenario) -> None:
        gc.collect()

    with pytest.raises(ShutdownContractError) as exc:
        assert_freeze_policy(never_freezes, freeze_scenarios(platforms=("rocm",)))
    (finding,) = exc.value.findings
    assert finding.details["scenario"] == "rocm-drain0-clean"
    assert "did not freeze" in finding.message


def test_a_freeze_by_garbage_the_child_inherited_is_not_the_targets() -> None:
    """An earlier test's object in a reference cycle whose finalizer freezes the heap, still
    uncollected in the parent: collected in the forked child, it froze there (Python 3.12 CI:
    every scenario "froze its heap at exit")."""

    parent = os.getpid()

    class FreezesWhenCollected:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            if os.getpid() != parent:  # collected here, it leaves this process alone
                gc.freeze()

    gc.disable()
    try:
        FreezesWhenCollected()  # garbage until the next collection: in the child
        report = assert_freeze_policy(_run(v.run_engine_core), start_method="fork")
    finally:
        gc.enable()
        gc.collect()
    facts = report.details["scenarios"]
    assert [sid for sid, f in facts.items() if f["frozen"]] == ["rocm-drain0-clean"]


def test_a_child_that_never_reaches_its_end_is_reported() -> None:
    def exits_hard(scenario: FreezeScenario) -> None:
        os._exit(0)

    with pytest.raises(ShutdownContractError) as exc:
        assert_freeze_policy(exits_hard, [FreezeScenario("cuda", 0)], start_method="fork")
    assert "could not be read" in exc.value.findings[0].message


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (functools.partial(FreezeScenario, "tpu", 0), "platform"),
        (functools.partial(FreezeScenario, "rocm", -1), "shutdown_timeout"),
        (functools.partial(FreezeScenario, "rocm", 0, "crash"), "exit"),
        (functools.partial(assert_freeze_policy, print, [("rocm", 0)]), "scenarios"),
    ],
)
def test_bad_freeze_arguments_name_the_argument(make: Any, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        make()


def test_reading_the_finalizer_registry_survives_a_collection_that_runs_finalizers() -> None:
    """Copying ``weakref.finalize``'s registry item by item allocates; a collection that sets off
    runs finalizers, which leave the registry mid-copy: "dictionary changed size during
    iteration" (once in make test). With a collection on every allocation and objects in cycles
    that only the collector frees, the old copy failed 11 of 300 rounds."""
    import gc
    import weakref

    from pytest_shutdown.helpers.cleanups import finalizer_registrations, pending_finalizers

    class Node:
        me: object

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for _ in range(300):
            for _ in range(50):
                node = Node()
                node.me = node  # a cycle: only the collector frees it, running its finalizer
                weakref.finalize(node, int)
                del node
            target = Node()
            assert pending_finalizers(target) == []
            assert finalizer_registrations(target) == []
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
