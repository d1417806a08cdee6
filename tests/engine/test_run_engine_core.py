"""run_engine_core in a real child process, observed through real signals and its lifecycle log.

The child appends one JSON line per lifecycle event; its ``final`` event is written after
run_engine_core's ``finally`` (after any ``gc.freeze()``): the state its interpreter exits with.
"""

from __future__ import annotations

import os
import signal

import pytest
from engine_proc_testing import (
    assert_gone,
    engine_owner,
    events,
    fast_config,
    wait_event,
    wait_for,
)

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCoreOutput, FinishReason
from pytest_shutdown.engine.core_proc import SHUTTING_DOWN_ERROR, ChildFaults
from pytest_shutdown.engine.processes import EngineProcManager, kill_process_tree
from pytest_shutdown.engine.start import mp_context


def start_engine(
    managers: list[EngineProcManager], config: EngineConfig, log: str, **faults: object
) -> tuple[EngineProcManager, int]:
    manager = EngineProcManager(config, lifecycle_log=log, faults=ChildFaults(**faults))
    managers.append(manager)
    pid = manager.processes[0].pid
    assert pid is not None
    return manager, pid


def collect_until_finished(manager: EngineProcManager, request_id: str) -> EngineCoreOutput:
    tokens: list[int] = []
    while True:
        out = manager.outputs.get(timeout=10)
        if out.request_id != request_id:
            continue
        tokens.extend(out.new_token_ids)
        if out.finished:
            return EngineCoreOutput(request_id, tokens, out.finish_reason)


def sigterm_and_join(manager: EngineProcManager, pid: int) -> int | None:
    """SIGTERM the engine child, wait (10 s at most) for it to end: its exit code."""
    os.kill(pid, signal.SIGTERM)
    manager.processes[0].join(10)
    return manager.processes[0].exitcode


def sigterm_mid_request(
    managers: list[EngineProcManager],
    log: str,
    shutdown_timeout: float,
    request_id: str,
    max_tokens: int,
) -> tuple[int, EngineCoreOutput, EngineCoreOutput]:
    """An engine with ``shutdown_timeout`` SIGTERMed once a request produced its first output,
    ended with exit code 0: its pid, that first output and the rest of the request."""
    manager, pid = start_engine(
        managers, fast_config(shutdown_timeout=shutdown_timeout, step_delay_s=0.02), log
    )
    manager.add_request(request_id, [1, 2, 3], max_tokens=max_tokens)
    first = manager.outputs.get(timeout=10)

    os.kill(pid, signal.SIGTERM)
    result = collect_until_finished(manager, request_id)
    manager.processes[0].join(10)

    assert manager.processes[0].exitcode == 0
    return pid, first, result


# -- gc.freeze only after a clean ROCm exit --------------------------------------------------------
# scenario: (config changes, faults, exit code expected, heap frozen at the end of life)
FREEZE_SCENARIOS = {
    "clean-rocm-exit-freezes": (dict(platform="rocm"), {}, 0, True),
    "not-rocm": (dict(platform="cuda"), {}, 0, False),
    "non-zero-exit-code": (dict(platform="rocm"), dict(exit_code=2), 2, False),
    "work-left": (dict(platform="rocm"), dict(leave_work=True), 0, False),
    "positive-timeout": (dict(platform="rocm", shutdown_timeout=1.0), {}, 0, False),
    "state-not-shutting-down": (dict(platform="rocm"), dict(exit_while_requested=True), 0, False),
}


@pytest.mark.parametrize("scenario", list(FREEZE_SCENARIOS), ids=list(FREEZE_SCENARIOS))
def test_gc_freeze_only_after_a_clean_rocm_exit(
    scenario: str, managers: list[EngineProcManager], log: str
) -> None:
    changes, faults, exit_code, frozen = FREEZE_SCENARIOS[scenario]
    manager, pid = start_engine(managers, fast_config(**changes), log, **faults)

    assert sigterm_and_join(manager, pid) == exit_code
    started = events(log, "started", pid)[0]
    final = wait_event(log, "final", pid)
    assert final["exit"] == exit_code
    assert (final["freeze_count"] > started["freeze_count"]) is frozen, final
    assert bool(events(log, "gc_frozen", pid)) is frozen


def test_a_has_work_that_raises_does_not_change_the_exit_code(
    managers: list[EngineProcManager], log: str
) -> None:
    manager, pid = start_engine(
        managers, fast_config(platform="rocm"), log, has_work_raises=True
    )

    assert sigterm_and_join(manager, pid) == 0
    assert wait_event(log, "loop_exited", pid)["clean"] is False  # unknown counts as unclean
    final = wait_event(log, "final", pid)
    assert final["exit"] == 0 and final["freeze_count"] == 0
    assert events(log, "cleanup_finished", pid)


# -- drain vs abort ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shutdown_timeout", "max_tokens", "reason", "event", "mode"),
    [
        pytest.param(
            0.0, 100_000, FinishReason.ABORTED, "shutdown_requested", "abort",
            id="timeout-zero-aborts-in-flight-requests",
        ),
        pytest.param(
            30.0, 40, FinishReason.LENGTH, "shutdown_requested", "drain",
            id="a-positive-timeout-drains-in-flight-requests",
        ),
        pytest.param(
            0.5, 100_000, FinishReason.ABORTED, "drain_cut_short", None,
            id="a-drain-that-outlasts-its-timeout-aborts-the-rest",
        ),
    ],
)
def test_a_sigterm_drains_or_aborts_in_flight_requests(
    managers: list[EngineProcManager],
    log: str,
    shutdown_timeout: float,
    max_tokens: int,
    reason: FinishReason,
    event: str,
    mode: str | None,
) -> None:
    pid, first, result = sigterm_mid_request(
        managers, log, shutdown_timeout, "in-flight", max_tokens=max_tokens
    )

    assert result.finish_reason is reason
    if reason is FinishReason.LENGTH:  # drained: every token it asked for
        assert len(first.new_token_ids) + len(result.new_token_ids) == max_tokens
    logged = events(log, event, pid)  # the child has exited: its log is complete
    assert logged
    if mode is not None:
        assert logged[-1]["mode"] == mode


def test_requests_and_utility_calls_during_shutdown_are_rejected(
    managers: list[EngineProcManager], log: str
) -> None:
    manager, pid = start_engine(
        managers, fast_config(shutdown_timeout=5.0, step_delay_s=0.02), log
    )
    manager.add_request("draining", [1, 2, 3], max_tokens=100_000)
    manager.outputs.get(timeout=10)
    assert manager.call_utility("ping") == "pong"

    os.kill(pid, signal.SIGTERM)
    wait_event(log, "shutdown_requested", pid)
    manager.add_request("late", [4, 5, 6], max_tokens=4)
    late = collect_until_finished(manager, "late")
    with pytest.raises(RuntimeError, match=SHUTTING_DOWN_ERROR):
        manager.call_utility("ping")

    assert late.finish_reason is FinishReason.ABORTED and late.new_token_ids == []
    assert events(log, "request_rejected", pid)[0]["request_id"] == "late"


# -- signals --------------------------------------------------------------------------------------
def test_a_second_sigterm_during_cleanup_does_not_cut_it_short(
    managers: list[EngineProcManager], log: str
) -> None:
    manager, pid = start_engine(managers, fast_config(teardown_delay_s=1.0), log)

    os.kill(pid, signal.SIGTERM)
    wait_event(log, "cleanup_started", pid)
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    manager.processes[0].join(10)

    assert manager.processes[0].exitcode == 0  # not -15: the cleanup ran to its end
    order = [e["event"] for e in events(log, pid=pid)]
    assert order.index("cleanup_started") < order.index("cleanup_finished")
    assert order.index("cleanup_finished") < order.index("handlers_restored")


def test_a_sigterm_before_the_engine_exists_is_not_lost(
    managers: list[EngineProcManager], log: str
) -> None:
    manager, pid = start_engine(managers, fast_config(), log, signal_before_engine=True)

    # Nobody signals it again: the remembered SIGTERM alone must end it.
    manager.processes[0].join(10)

    assert manager.processes[0].exitcode == 0
    assert wait_event(log, "engine_built", pid)["signals"] == [signal.SIGTERM]
    assert events(log, "shutdown_requested", pid)


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_children_exit_by_themselves_when_their_parent_is_sigkilled(start_method: str) -> None:
    ctx = mp_context("forkserver")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    config = fast_config(data_parallel_size=2, start_method=start_method, teardown_delay_s=0.2)
    owner = ctx.Process(target=engine_owner, args=(os.getpid(), child_conn, config))
    owner.start()
    child_conn.close()
    try:
        assert parent_conn.poll(60), "the engine owner never reported its engines"
        engine_pids, helper_pids = parent_conn.recv()
        assert len(engine_pids) == 2

        os.kill(owner.pid, signal.SIGKILL)  # type: ignore[arg-type]
        owner.join(5)

        assert_gone(engine_pids, timeout=5.0, what="engines of the killed parent")
        assert_gone(helper_pids, timeout=5.0, what="fork server of the killed parent")
    finally:
        parent_conn.close()
        if owner.is_alive():
            kill_process_tree(owner.pid)  # type: ignore[arg-type]
        owner.join(5)


def test_the_parent_is_watched_by_pid_not_by_the_fork_server(
    managers: list[EngineProcManager], log: str
) -> None:
    # Under the fork server the engine's OS parent is the server, yet it watches this process.
    manager, pid = start_engine(managers, fast_config(start_method="forkserver"), log)
    import psutil  # noqa: PLC0415

    assert psutil.Process(pid).ppid() != os.getpid()
    manager.shutdown(0)
    assert_gone([pid])
    wait_for(lambda: manager.is_shut_down, 1, "the manager to be shut down")
