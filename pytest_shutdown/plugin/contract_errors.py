"""Every ShutdownContractError a test raises reaches the reports, and its codes the status line.

An error raised by a helper in any phase becomes data: its findings the test's JUnit
``user_properties`` (``shutdown:<code>``) and, with a shutdown report, findings in the summary
and the JSON; its codes go on the report (``shutdown_codes``, carried under xdist) and, for a
failed or xfailed body, on the verbose status line (``FAILED [thread-leak]``). Findings already
recorded (``shutdown_check``, the engine fixtures, the guard) are not recorded twice.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import Any

import pytest

from pytest_shutdown.plugin.settings import shows_details

#: The report section with every fact of a failure's findings (``-vv``, ``--shutdown-details``).
DETAILS_SECTION = "shutdown finding details"
#: The attribute of a ``TestReport`` that holds the codes of its ShutdownContractError.
CODES_ATTR = "shutdown_codes"
PLUGIN_NAME = "pytest-shutdown-contract-errors"


def note_contract_error(item: pytest.Item, call: pytest.CallInfo[None], report: Any) -> None:
    """The codes and findings of a phase's ShutdownContractError go on its report, the test's
    user properties and the shutdown report."""
    error = call.excinfo.value if call.excinfo is not None else None
    # No such error exists before its module is imported: a session that never imports it
    # loads neither it nor the findings' texts.
    findings = sys.modules.get("pytest_shutdown.findings.finding")
    if findings is None or not isinstance(error, findings.ShutdownContractError):
        return
    from pytest_shutdown.findings.text import finding_lines  # noqa: PLC0415

    setattr(report, CODES_ATTR, ", ".join(dict.fromkeys(error.codes)))
    show_codes_on_status_line(item.config)
    if shows_details(item.config):
        # -vv / --shutdown-details: every fact of every finding, as the JSON report has it
        text = "\n".join(
            line for f in error.findings for line in finding_lines(f.to_dict(), details=True)
        )
        report.sections.append((DETAILS_SECTION, text))
    recorded = {(name, value) for name, value in item.user_properties}
    new = [f for f in error.findings if (f"shutdown:{f.code}", f.message) not in recorded]
    for finding in new:
        prop = (f"shutdown:{finding.code}", finding.message)
        item.user_properties.append(prop)
        report.user_properties.append(prop)
    shutdown_report = item.config.pluginmanager.get_plugin("pytest-shutdown-report")
    if new and shutdown_report is not None:
        shutdown_report.add_findings(item.nodeid, [f.to_dict() for f in new])


class ContractErrorsOnStatusLine:
    """The status-line half (``pytest-shutdown-contract-errors`` with the guard on, whose
    report wrapper calls :func:`note_contract_error` itself: one wrapper per phase, not two)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, Any] | None:
        """``FAILED [code]`` / ``XFAIL [code]`` for a test whose body raised (setup and teardown
        errors keep pytest's ``ERROR``)."""
        codes = getattr(report, CODES_ATTR, None)
        if not codes or report.when != "call":
            return None
        if hasattr(report, "wasxfail"):
            return "xfailed", "x", (f"XFAIL [{codes}]", {"yellow": True})
        if report.failed:
            return "failed", "F", (f"FAILED [{codes}]", {"red": True})
        return None


class ContractErrorsReported(ContractErrorsOnStatusLine):
    """The pytest plugin object (``pytest-shutdown-contract-errors``) with the guard off."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        note_contract_error(item, call, report)
        return report


def show_codes_on_status_line(config: pytest.Config) -> None:
    """Register the status-line hook with the first code (a session without contract errors
    pays no hook call per report; an xdist controller registers it at start-up)."""
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(ContractErrorsOnStatusLine(), PLUGIN_NAME)
