from __future__ import annotations

import json

import pytest

from pytest_shutdown import FINDING_CODES, Finding, ShutdownContractError
from pytest_shutdown.findings.finding import raise_if_any


def test_the_codes_of_the_design() -> None:
    assert sorted(FINDING_CODES) == sorted(
        [
            "shutdown-raised",
            "cleanup-repeated",
            "cleanup-missing",
            "finalizer-bound-method",
            "finalizer-holds-object",
            "not-collected",
            "blocking-close",
            "loop-blocked",
            "thread-leak",
            "process-leak",
            "gc-frozen-leak",
            "force-killed",
            "timeout-policy",
            "device-memory-held",
            "shutdown-budget",
            "gc-freeze-policy",
            "orphan-process",
            "exit-hang",
            "growth",
            "collective-hang",
            "process-group-left",
            "ray-resource-left",
            "fd-leak",
            "port-leak",
            "shm-leak",
            "global-state",
            "atexit-holds-object",
            "collateral-kill",
            "task-leak",
            "loop-left",
            "asyncgen-left",
            "coroutine-never-awaited",
            "zmq-term-blocked",
            "shutdown-logged-error",
        ]
    )


def test_unknown_code_is_rejected_with_the_accepted_list() -> None:
    with pytest.raises(ValueError, match="unknown finding code 'leak'; accepted: shutdown-raised"):
        Finding("leak", "x")


def test_finding_round_trips_through_json() -> None:
    finding = Finding("thread-leak", "thread 'w' is still running", {"threads": ["w"]})
    data = json.loads(json.dumps(finding.to_dict()))
    assert Finding.from_dict(data) == finding
    with pytest.raises(AttributeError):
        finding.code = "x"  # type: ignore[misc]


def test_error_lists_every_message_and_is_an_assertion_error() -> None:
    found = [Finding("cleanup-repeated", "cache closed twice"), Finding("not-collected", "kept")]
    with pytest.raises(AssertionError) as info:
        raise_if_any(found)
    error = info.value
    assert isinstance(error, ShutdownContractError)
    assert error.findings == found and error.codes == ["cleanup-repeated", "not-collected"]
    assert str(error) == "[cleanup-repeated] cache closed twice\n[not-collected] kept"


def test_no_findings_no_error() -> None:
    raise_if_any([])
    with pytest.raises(ValueError, match="at least one finding"):
        ShutdownContractError([])


def test_the_report_cuts_a_long_command_line_as_the_finding_text_does() -> None:
    """One rule for command lines in the short report: a process's line and a budget's kill
    are cut at ``CMDLINE_CHARS``; ``--shutdown-details`` lists them whole."""
    from pytest_shutdown.findings.text import CMDLINE_CHARS
    from pytest_shutdown.plugin.report import render_budget, render_findings

    cmdline = ["python", "-c", "x" * 2000]
    finding = Finding(
        "process-leak",
        "1 process test_x started is still running after the grace: 7 (python).",
        {"processes": [{"pid": 7, "name": "python", "cmdline": cmdline}]},
    ).to_dict()
    (line,) = [line for line in render_findings([finding]).splitlines() if "process 7" in line]
    assert line.endswith("...") and len(line) < CMDLINE_CHARS + 40, line
    assert "x" * 2000 in render_findings([finding], details=True)
    budget = {"budget_s": 1, "elapsed_s": 1.5, "method": "signal", "threads": []}
    killed = {"pid": 7, "name": "python", "cmdline": cmdline}
    (kill_line,) = render_budget({**budget, "killed": [killed]}).splitlines()[1:2]
    assert kill_line.endswith("...") and len(kill_line) < CMDLINE_CHARS + 40, kill_line
    unknown = render_budget({**budget, "killed": [{"pid": 8, "name": "sh"}]})
    assert "killed process 8 (sh): ?" in unknown
