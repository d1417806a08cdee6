"""Shared by every example suite: show the finding codes of a check on the test's status line.

A strict xfail in ``examples/regressions/`` prints ``XFAIL [finalizer-bound-method]`` instead of a
bare ``XFAIL`` under ``pytest -v``, so ``make demo`` shows which bug each regression test found.
A copy of these two hooks in your own ``conftest.py`` does the same for your suite.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the finding codes of a ShutdownContractError on the report (plain data: xdist-safe)."""
    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, ShutdownContractError):
        codes = dict.fromkeys(error.codes)  # each code once, in order
        report.shutdown_codes = ", ".join(codes)  # type: ignore[attr-defined]
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, Any] | None:
    """``XFAIL [code]`` / ``FAILED [code]`` on the verbose status line."""
    codes = getattr(report, "shutdown_codes", None)
    if not codes or report.when != "call":
        return None
    if hasattr(report, "wasxfail"):
        return "xfailed", "x", (f"XFAIL [{codes}]", {"yellow": True})
    if report.failed:
        return "failed", "F", (f"FAILED [{codes}]", {"red": True})
    return None
