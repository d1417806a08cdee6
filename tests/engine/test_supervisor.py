"""DPSupervisor over a real three-level tree (supervisor -> children -> engine processes)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
import weakref
from pathlib import Path

import psutil
import pytest
from engine_proc_testing import assert_gone, events, fast_config, wait_event
from inner_runs import fresh_python

from pytest_shutdown.engine.processes import EngineProcManager
from pytest_shutdown.engine.supervisor import DPSupervisor

FORCE_KILL_MESSAGE = "force killing remaining processes count="


def tree_pids(supervisor: DPSupervisor) -> list[int]:
    """Every process under the supervisor's children: children, engines, their helpers."""
    pids: list[int] = []
    for child in supervisor.children:
        assert child.pid is not None
        root = psutil.Process(child.pid)
        pids += [child.pid, *(p.pid for p in root.children(recursive=True))]
    return pids


def test_children_draining_within_the_budget_are_not_force_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ROCm 0/0: the budget is the cleanup grace (6 s) + child_exit_grace_s (0.5 s). The engines'
    # teardown (1.2 s) outlasts child_exit_grace_s alone, so a supervisor that gave 0/0 no
    # grace would kill these children. The wide grace keeps a loaded 2-core CI machine (slow
    # forks and exits) inside the budget; the test still ends when the children do.
    caplog.set_level(logging.WARNING, logger="pytest_shutdown.engine")
    log = str(tmp_path / "life.jsonl")
    config = fast_config(
        platform="rocm", shutdown_timeout=0.0, rocm_process_grace_s=6.0,
        child_exit_grace_s=0.5, teardown_delay_s=1.2,
    )
    supervisor = DPSupervisor(config, num_children=2, engine_start_method="fork", lifecycle_log=log)
    try:
        pids = tree_pids(supervisor)
        engine_pids = [pid for pids_ in supervisor.engine_pids.values() for pid in pids_]
        assert len(engine_pids) == 2 and set(engine_pids) <= set(pids)
        for child in supervisor.children:  # each child leads its own process group
            assert os.getpgid(child.pid) == child.pid  # type: ignore[arg-type]

        outcome = supervisor.shutdown(signum=signal.SIGINT)
    finally:
        supervisor.shutdown()

    assert outcome is not None
    assert outcome.timeout == pytest.approx(6.5) == supervisor.shutdown_budget()
    assert outcome.force_killed == []
    assert set(outcome.exitcodes.values()) == {0}
    assert [r for r in caplog.records if FORCE_KILL_MESSAGE in r.getMessage()] == []
    assert_gone(pids, what="the supervisor's tree")
    for pid in engine_pids:
        # SIGINT reached the engines through their group, before their manager's SIGTERM.
        assert events(log, "shutdown_requested", pid)[0]["signals"][0] == signal.SIGINT
        assert events(log, "final", pid)[0]["exit"] == 0


def test_children_outlasting_the_budget_have_their_whole_trees_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No drain deadline in the children (None: the default 10 s), engines that take 5 s to
    # tear down, and a supervisor told to finish in 0.5 s + 0.5 s.
    caplog.set_level(logging.WARNING, logger="pytest_shutdown.engine")
    config = fast_config(
        shutdown_timeout=None, default_process_timeout_s=10.0, child_exit_grace_s=0.5,
        teardown_delay_s=5.0,
    )
    supervisor = DPSupervisor(config, num_children=2, engine_start_method="fork")
    try:
        pids = tree_pids(supervisor)
        outcome = supervisor.shutdown(timeout=0.5)
    finally:
        supervisor.shutdown()

    assert outcome is not None and outcome.timeout == pytest.approx(1.0)
    assert sorted(outcome.force_killed) == ["DPSupervisorChild_0", "DPSupervisorChild_1"]
    warnings = [r.getMessage() for r in caplog.records if FORCE_KILL_MESSAGE in r.getMessage()]
    assert warnings == [f"{FORCE_KILL_MESSAGE}2"]
    assert_gone(pids, what="the killed children's trees (no orphan)")


def test_default_start_method_tree_and_a_dropped_supervisor_leave_no_orphan() -> None:
    # The children start their engines through their own fork servers (the default).
    def make() -> tuple[weakref.ref[DPSupervisor], list[int]]:
        supervisor = DPSupervisor(fast_config(), num_children=1)
        return weakref.ref(supervisor), tree_pids(supervisor)

    ref, pids = make()
    gc.collect()
    assert ref() is None
    assert len(pids) >= 3  # child, its fork server, its engine (and maybe a resource tracker)
    assert_gone(pids, what="the dropped supervisor's tree")


def test_a_signal_to_a_childs_group_leaves_it_its_engines_exit_statuses(tmp_path: Path) -> None:
    # The dp_supervisor fixture's shape: fork servers at both levels. Each child's fork server is
    # in the child's group, so the supervisor's SIGTERM reached it too: killed, it took the exit
    # status of the EngineCore it had forked with it, and the child read 255 for an engine still
    # shutting down (waiting neither for it nor killing it).
    log = str(tmp_path / "life.jsonl")
    supervisor = DPSupervisor(fast_config(shutdown_timeout=5.0), num_children=2, lifecycle_log=log)
    try:
        pids = tree_pids(supervisor)
        engine_pids = [pid for pids_ in supervisor.engine_pids.values() for pid in pids_]
        outcome = supervisor.shutdown()
    finally:
        supervisor.shutdown()

    assert outcome is not None and outcome.force_killed == []
    assert set(outcome.exitcodes.values()) == {0}
    seen = events(log, "engines_stopped")
    assert [e["exitcodes"] for e in seen] == [{"EngineCore_DP0": 0}] * 2
    assert [e["force_killed"] for e in seen] == [[], []]
    for pid in engine_pids:
        assert events(log, "final", pid)[0]["exit"] == 0
    assert_gone(pids, what="the supervisor's tree")


def test_supervisor_rejects_bad_arguments_naming_them() -> None:
    with pytest.raises(ValueError, match="num_children"):
        DPSupervisor(fast_config(), num_children=0)
    with pytest.raises(ValueError, match="engine_start_method"):
        DPSupervisor(fast_config(), engine_start_method="thread")


def test_a_signal_to_the_supervisor_is_forwarded_to_every_group(tmp_path: Path) -> None:
    import threading  # noqa: PLC0415

    log = str(tmp_path / "life.jsonl")
    supervisor = DPSupervisor(
        fast_config(shutdown_timeout=5.0), num_children=2, engine_start_method="fork",
        lifecycle_log=log,
    )
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    try:
        pids = tree_pids(supervisor)
        engine_pids = [pid for pids_ in supervisor.engine_pids.values() for pid in pids_]
        assert supervisor.run_until_signal(timeout=0.05) is None  # no signal: keeps serving
        timer.start()
        outcome = supervisor.run_until_signal(timeout=30)
    finally:
        timer.cancel()
        supervisor.shutdown()

    assert outcome is not None and outcome.force_killed == []
    assert set(outcome.exitcodes.values()) == {0}
    assert_gone(pids, what="the supervisor's tree")
    for pid in engine_pids:
        assert events(log, "shutdown_requested", pid)[0]["mode"] == "drain"
        assert events(log, "final", pid)[0]["exit"] == 0
    # The previous handlers are back.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_late_duplicate_sigterms_leave_an_engine_its_clean_exit(
    managers: list[EngineProcManager], log: str
) -> None:
    # The cause of the forwarding test's flake (about 1 run in 12 under load: no "final" event
    # for one engine). The supervisor signals each child's whole group, so an engine gets that
    # SIGTERM, and then a second one from its child's manager.shutdown(). An engine that had
    # already finished its cleanup and restored the default handlers died of that late
    # SIGTERM: exit -15 and, often, no "final" event. Here late SIGTERMs keep coming until the
    # engine is gone; a few rounds, since the window is short.
    for _round in range(6):
        manager = EngineProcManager(
            fast_config(shutdown_timeout=5.0, start_method="fork"), lifecycle_log=log
        )
        managers.append(manager)
        proc = manager.processes[0]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGTERM)
        wait_event(log, "cleanup_started", proc.pid)
        deadline = time.monotonic() + 30
        while proc.is_alive() and time.monotonic() < deadline:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        proc.join(10)
        assert proc.exitcode == 0
        assert events(log, "final", proc.pid)[0]["exit"] == 0


SHIELDED_BEFORE_TORCH = """
import os, sys, time
from multiprocessing import forkserver
from pytest_shutdown.engine.start import mp_context

mp_context("forkserver")  # the engine's preload
forkserver.ensure_running()  # returns before the server's preload ends
pid = forkserver._forkserver._forkserver_pid
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    with open(f"/proc/{pid}/status") as f:
        ignored = next(int(l.split()[1], 16) for l in f if l.startswith("SigIgn:"))
    if ignored & (1 << (15 - 1)):  # SIGTERM
        with open(f"/proc/{pid}/maps") as f:
            print("torch loaded" if "libtorch" in f.read() else "torch not loaded yet")
        break
else:
    print("never shielded")
"""


def test_the_fork_server_ignores_sigterm_before_it_imports_torch() -> None:
    """A SIGTERM to the parent's group during the server's second of importing torch killed it
    (the shield came with the last preloaded module); now it is shielded before torch loads."""
    assert fresh_python(SHIELDED_BEFORE_TORCH, timeout=90).split("\n")[0] == "torch not loaded yet"
