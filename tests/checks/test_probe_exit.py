"""probe_exit (how a child really ends) and assert_not_force_killed."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import time
from typing import Any

import psutil
import pytest

from pytest_shutdown import ShutdownContractError, probe_exit
from pytest_shutdown.helpers.exits import assert_not_force_killed


def _clean() -> None:
    gc.freeze()
    try:
        pass
    finally:
        gc.unfreeze()


def _leaves_gc_frozen() -> None:
    try:
        raise SystemExit(0)
    finally:
        gc.freeze()  # the target's own finally runs before the probe reads the count


def _exits(code: int) -> None:
    sys.exit(code)


def _raises() -> None:
    raise RuntimeError("engine core crashed")


def _terminates_itself() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)


def _hangs(pid_file: str) -> None:
    with open(pid_file, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(60)


def test_clean_exit_and_freeze_count_restored() -> None:
    record = probe_exit(_clean)
    assert record.exitcode == 0
    assert record.gc_freeze_count == 0
    assert not record.timed_out and record.signal_name is None


def test_freeze_left_behind_is_seen_after_the_targets_finally() -> None:
    record = probe_exit(_leaves_gc_frozen)
    assert record.exitcode == 0
    assert record.gc_freeze_count is not None and record.gc_freeze_count > 0


def test_exit_codes_follow_the_multiprocessing_convention() -> None:
    assert probe_exit(_exits, 3).exitcode == 3
    crashed = probe_exit(_raises)
    assert crashed.exitcode == 1
    assert "RuntimeError: engine core crashed" in crashed.stderr_tail
    killed = probe_exit(_terminates_itself)
    assert killed.exitcode == -signal.SIGTERM
    assert killed.signal_name == "SIGTERM"
    assert killed.gc_freeze_count is None


def test_a_hung_target_is_killed_at_the_timeout_and_not_left_behind(tmp_path: object) -> None:
    pid_file = os.path.join(str(tmp_path), "pid")
    started = time.monotonic()
    record = probe_exit(_hangs, pid_file, timeout=0.5)
    assert record.timed_out
    assert record.exitcode == -signal.SIGKILL
    assert 0.5 <= record.duration_s < 10
    assert time.monotonic() - started < 15
    with open(pid_file) as handle:
        pid = int(handle.read())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_spawn_start_method() -> None:
    record = probe_exit(_exits, 4, start_method="spawn", timeout=60)
    assert (record.exitcode, record.start_method) == (4, "spawn")


@pytest.mark.parametrize(("kwargs", "name"), [({"timeout": 0}, "timeout"),
                                              ({"start_method": "thread"}, "start_method")])
def test_bad_arguments_name_the_option(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        probe_exit(_clean, **kwargs)  # type: ignore[arg-type]


def _ignores_sigterm(ready: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(30)


def test_force_killed_is_reported_and_a_clean_exit_is_not() -> None:
    # Skip only when torch (the 'engine' extra) is missing; a broken engine import still fails.
    pytest.importorskip("torch", reason="the engine package imports torch (extra 'engine')")
    from pytest_shutdown.engine import processes
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    stubborn = ctx.Process(target=_ignores_sigterm, args=(ready,), name="EngineCore_DP0")
    polite = ctx.Process(target=time.sleep, args=(30,), name="EngineCore_DP1")
    stubborn.start()
    polite.start()
    assert ready.wait(10)
    outcome = processes.shutdown_processes([stubborn, polite], timeout=0.3)
    with pytest.raises(ShutdownContractError) as exc:
        assert_not_force_killed(outcome)
    (finding,) = exc.value.findings
    assert finding.code == "force-killed"
    assert finding.details["force_killed"] == ["EngineCore_DP0"]
    assert finding.details["exitcodes"] == dict(outcome.exitcodes)
    assert outcome.exitcodes["EngineCore_DP1"] == -signal.SIGTERM
    assert "EngineCore_DP0" in finding.message
    assert_not_force_killed(outcome, expected=True)

    gentle = ctx.Process(target=time.sleep, args=(30,), name="EngineCore_DP2")
    gentle.start()
    clean = processes.shutdown_processes([gentle], timeout=5.0)
    assert_not_force_killed(clean)
    with pytest.raises(ShutdownContractError, match="expected"):
        assert_not_force_killed(clean, expected=True)


def test_outcome_without_the_fields_is_rejected() -> None:
    with pytest.raises(TypeError, match="`outcome` \\(object\\) lacks force_killed"):
        assert_not_force_killed(object())  # type: ignore[arg-type]
