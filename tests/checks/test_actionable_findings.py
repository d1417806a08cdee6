"""Findings a reader can act on, and misuse that is a clear error rather than a finding.

* ``orphan-process`` / ``exit-hang`` name the survivor's command line and level, ``exit-hang``
  the first frame of user code in the blocked stack;
* ``timeout-policy`` says what was checked (the pure policy or the call a spy saw) and the offset;
* an error of the test's own set-up is raised once, not reported as a finding per cell;
* wrong input to the helpers names what is wrong; every public ``assert_*`` hides its frames.
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import tree_subjects as subjects
import vllm_patterns as v

import pytest_shutdown
from pytest_shutdown import (
    Finding,
    NotCalledError,
    NothingCountedError,
    ShutdownContractError,
    assert_finalizes_on_gc,
    assert_not_force_killed,
    assert_timeout_decoupling,
    kill_tree_at,
    timeout_passed_to,
)
from pytest_shutdown.findings.text import first_user_frame, key_fact_lines
from pytest_shutdown.harness import outcome_from_processes
from pytest_shutdown.helpers.tree_launcher import TreeLauncher

SHORT_DEADLINE_S = 3.0


@pytest.fixture(scope="module")
def launcher() -> Iterator[TreeLauncher]:
    with TreeLauncher() as started:
        yield started


# -- 3. survivors: command line, level, first user frame ------------------------------------------

DUMP = '''Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/srv/engine/worker.py", line 42 in drain_forever
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f00 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 1590 in _shutdown
'''


def test_the_first_user_frame_skips_the_standard_library() -> None:
    stdlib = inspect.getfile(contextlib).rsplit("/", 1)[0]
    dump = DUMP.replace("/usr/lib/python3.11", stdlib)
    assert first_user_frame(dump) == "/srv/engine/worker.py:42 in drain_forever"
    assert first_user_frame(dump.replace("/srv/engine/worker.py", f"{stdlib}/queue.py")) == ""


def test_an_orphan_names_its_command_line_and_level() -> None:
    finding = Finding(
        "orphan-process",
        "python3 (pid 12, parent now 1) outlived SIGKILL to root (python3, pid 10) in phase ready",
        {"cmdline": ["python3", "-m", "engine.worker", "--rank", "1"], "level": "worker",
         "signal": "SIGKILL", "phase": "ready"},
    )
    text = str(ShutdownContractError([finding]))
    assert "  command line: python3 -m engine.worker --rank 1" in text.splitlines()
    assert "  level: worker (signal SIGKILL, phase ready)" in text.splitlines()
    assert key_fact_lines("thread-leak", finding.details) == []  # only the tree codes


def test_an_exit_hang_names_the_user_frame_that_blocks_it(launcher: TreeLauncher) -> None:
    record = kill_tree_at(
        subjects.non_daemon_thread_at_exit, signal="SIGTERM", deadline_s=SHORT_DEADLINE_S,
        launcher=launcher,
    )
    assert [f.code for f in record.findings] == ["exit-hang"]
    lines = str(ShutdownContractError(record.findings)).splitlines()
    assert any(
        line.startswith("  command line: ") and "python" in line
        and "(a fork of the tree launcher, now named " in line
        for line in lines
    ), lines
    assert "  level: root (signal SIGTERM, phase ready)" in lines
    frame = [line for line in lines if line.startswith("  first user frame: ")]
    assert frame and frame[0].endswith("in _block_forever"), lines
    assert "tree_subjects.py:" in frame[0]


# -- 3. timeout-policy says what was checked ------------------------------------------------------


def policy_ignoring_rocm(request: float | None, process: float | None, platform: str) -> Any:
    return process


def test_a_pure_policy_finding_names_the_policy_and_the_offset() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy_ignoring_rocm, grace=15.0, platforms=("rocm",),
                                  offset=2.0)
    messages = [f.message for f in exc.value.findings]
    assert any(
        m.startswith("timeout matrix cell rocm-req0-proc0: the pure policy policy_ignoring_rocm "
                     "returned 0, expected 17.0 (the rule's 15 + offset 2 s)")
        for m in messages
    ), messages
    assert exc.value.findings[0].details["checked"] == "the pure policy policy_ignoring_rocm"


def test_a_spied_call_finding_names_the_spied_function() -> None:
    policy = timeout_passed_to(
        "vllm_patterns:shutdown",
        lambda request, process: v.ManagerIgnoringThePolicy(request).shutdown(process),
    )
    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(policy, grace=15.0, platform=v.on_platform)
    (finding,) = exc.value.findings
    assert finding.message.startswith(
        "timeout matrix cell rocm-req0-proc0: the timeout the call passed to "
        "vllm_patterns.shutdown returned 0"
    ), finding.message


# -- 4. misuse: the test's own set-up errors, raised once -----------------------------------------


class ValidationError(ValueError):
    """Named as pydantic's: an engine config that rejects what the test built."""


def test_a_config_validation_error_is_the_tests_error_not_a_finding() -> None:
    def policy(request: float | None, process: float | None, platform: str) -> Any:
        if process is None:
            raise ValidationError("shutdown_timeout: Input should be a valid number")
        return process if platform == "cuda" or process else 15.0

    with pytest.raises(ValidationError, match="Input should be a valid number") as exc:
        assert_timeout_decoupling(policy, grace=15.0)
    if sys.version_info >= (3, 11):
        (note,) = exc.value.__notes__
        assert "raised ValidationError in 6 of 18 timeout-matrix cells" in note
        assert "error in the test's set-up" in note


def test_the_same_error_in_every_cell_is_raised_once() -> None:
    calls = []

    def broken(request: float | None, process: float | None, platform: str) -> Any:
        calls.append(platform)
        raise KeyError("engine_config")

    with pytest.raises(KeyError):
        assert_timeout_decoupling(broken, grace=15.0)
    assert len(calls) == 18  # every cell was asked: all raised the same, so it is the set-up


def test_a_policy_raising_in_one_cell_is_still_a_finding() -> None:
    def raises_on_rocm_zero(request: float | None, process: float | None, platform: str) -> Any:
        if platform == "rocm" and request == 0 and process == 0:
            raise ZeroDivisionError("grace / 0")
        return process

    with pytest.raises(ShutdownContractError) as exc:
        assert_timeout_decoupling(raises_on_rocm_zero, grace=15.0)
    assert [f.details["cell"] for f in exc.value.findings] == ["rocm-req0-proc0"]


def test_the_helpers_misuse_errors_are_public() -> None:
    assert issubclass(NotCalledError, AssertionError)
    assert issubclass(NothingCountedError, AssertionError)
    assert {"NotCalledError", "NothingCountedError"} <= set(pytest_shutdown.__all__)


def _exit_quietly() -> None:
    pass


def test_outcome_from_processes_works_without_started() -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_exit_quietly, name="quiet")
    proc.start()
    proc.join(30)

    outcome = outcome_from_processes([proc], timeout=1.0)

    assert outcome.duration_s is None and outcome.exitcodes == {"quiet": 0}
    assert_not_force_killed(outcome)


@dataclass
class WrongOutcome:
    force_killed: Any = "EngineCore_DP0"
    timeout: Any = "5"
    exitcodes: Any = field(default_factory=lambda: [("EngineCore_DP0", 0)])
    duration_s: Any = 0.1


def test_an_outcome_of_the_wrong_shape_names_each_attribute_and_type() -> None:
    with pytest.raises(TypeError) as exc:
        assert_not_force_killed(WrongOutcome())
    text = str(exc.value)
    assert (
        "outcome.force_killed is str ('EngineCore_DP0'); expected a list of process names" in text
    )
    assert "outcome.timeout is str ('5'); expected None or a number of seconds" in text
    assert "outcome.exitcodes is list" in text
    assert "duration_s" not in text  # the one right attribute is not named


class RaisesOnShutdown:
    def shutdown(self) -> None:
        raise RuntimeError("shutdown called on a closed engine")


def test_finalizes_on_gc_reports_a_raising_shutdown_as_shutdown_raised() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(RaisesOnShutdown)
    assert exc.value.codes == ["shutdown-raised"]
    assert "RuntimeError: shutdown called on a closed engine" in exc.value.findings[0].message


def _public_asserts() -> list[str]:
    return [n for n in pytest_shutdown.__all__ if n.startswith("assert_")]


@pytest.mark.parametrize("name", _public_asserts())
def test_every_public_assert_hides_its_own_frames(name: str) -> None:
    function = inspect.unwrap(getattr(pytest_shutdown, name))
    assert "__tracebackhide__" in function.__code__.co_varnames, f"{name} shows its own frames"


# -- 5. a phase the tree never reports fails fast --------------------------------------------------


def test_a_typo_of_a_reported_phase_fails_within_seconds(launcher: TreeLauncher) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError) as exc:
        kill_tree_at(subjects.phases_in_order, phase="redy", phase_timeout_s=60,
                     launcher=launcher)
    assert time.monotonic() - started < 30  # not the 60 s phase timeout
    text = str(exc.value)
    assert "phase 'redy'" in text and "did you mean 'ready'" in text
    assert "reported so far: loading, ready" in text


def test_a_phase_the_tree_declares_it_does_not_know_fails_at_once(launcher: TreeLauncher) -> None:
    with pytest.raises(ValueError, match=r"never reaches phase 'warm'; the phases it knows: "
                                         r"starting, ready"):
        kill_tree_at(subjects.declares_its_phases, phase="warm", phase_timeout_s=60,
                     launcher=launcher)


def test_a_declared_phase_is_still_reached(launcher: TreeLauncher) -> None:
    record = kill_tree_at(subjects.declares_its_phases, phase="ready", signal="SIGTERM",
                          deadline_s=10.0, launcher=launcher)
    assert record.died, record.findings


def test_a_typo_of_a_phases_entry_fails_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"phase: 'redy' is not in phases= \(ready\) and looks "
                                         r"like a typo of 'ready'"):
        kill_tree_at(subjects.phases_in_order, phase="redy", phases={"ready": "model loaded"})
