"""A ShutdownContractError raised by a plain helper in any phase reaches every report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from inner_runs import RAISES_WHEN_REPEATED

SUITE = (
    """
import pytest
from pytest_shutdown import ShutdownContractError, assert_idempotent_shutdown
"""
    + RAISES_WHEN_REPEATED
    + """

@pytest.fixture
def checked_in_setup():
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)
    yield


@pytest.fixture
def checked_in_teardown():
    yield
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)


def test_setup(checked_in_setup):
    pass


def test_call():
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)


def test_teardown(checked_in_teardown):
    pass


@pytest.mark.xfail(raises=ShutdownContractError, strict=True)
def test_known_bug():
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)


def test_through_shutdown_check(shutdown_check):
    shutdown_check.assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)


def test_other_failure():
    assert 1 == 2
"""
)

NAMES = (
    "test_setup",
    "test_call",
    "test_teardown",
    "test_known_bug",
    "test_through_shutdown_check",
)


def junit_properties(path: object) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for case in ET.parse(str(path)).getroot().iter("testcase"):
        names = [p.get("name", "") for p in case.iter("property")]
        found.setdefault(case.get("name", ""), []).extend(names)
    return found


def test_every_phase_reaches_status_line_json_and_junit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_contract=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "-v", "--shutdown-report=r.json",
        "--junitxml=j.xml",
    )
    result.assert_outcomes(passed=1, failed=3, errors=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_setup ERROR*",
            "*::test_call FAILED [[]shutdown-raised[]]*",
            "*::test_teardown PASSED*",
            "*::test_teardown ERROR*",
            "*::test_known_bug XFAIL [[]shutdown-raised[]]*",
            "*::test_through_shutdown_check FAILED [[]shutdown-raised[]]*",
            "*::test_other_failure FAILED*",
        ]
    )
    assert "test_other_failure FAILED [" not in result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    by_name = {t["nodeid"].rpartition("::")[2]: t for t in report["tests"]}
    assert sorted(by_name) == sorted(NAMES)
    for name in NAMES:  # each finding once: shutdown_check's are not recorded a second time
        # calls 2 and 3 of the helper's three
        assert [f["code"] for f in by_name[name]["findings"]] == ["shutdown-raised"] * 2, name
    summary = result.stdout.str().split("= shutdown =")[-1]
    assert all(f"::{name}: [shutdown-raised]" in summary for name in NAMES)
    properties = junit_properties(pytester.path / "j.xml")
    for name in NAMES:
        assert properties[name] == ["shutdown:shutdown-raised"] * 2, (name, properties)


def test_without_the_guard_codes_still_reach_the_status_line_and_junit(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_contract=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-v", "--junitxml=j.xml")
    result.stdout.fnmatch_lines(
        [
            "*::test_call FAILED [[]shutdown-raised[]]*",
            "*::test_known_bug XFAIL [[]shutdown-raised[]]*",
        ]
    )
    assert "= shutdown =" not in result.stdout.str()
    assert junit_properties(pytester.path / "j.xml")["test_teardown"] == [
        "shutdown:shutdown-raised"
    ] * 2


def test_codes_travel_with_reports_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_contract=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-n", "2", "-v", "--shutdown-report=r.json"
    )
    result.stdout.fnmatch_lines(["*XFAIL [[]shutdown-raised[]]*test_known_bug*"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert sorted(t["nodeid"].rpartition("::")[2] for t in report["tests"]) == sorted(NAMES)
