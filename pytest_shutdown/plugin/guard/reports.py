"""What the guard tells pytest: the report wrapper of every phase, a test's record and
``user_properties``, and the error (fail mode) or the warning at the test's line (warn mode);
a test that already failed gets them as a report section instead. The records travel with the
teardown report (on xdist to the controller).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.outcomes import Failed  # pytest.fail.Exception, spelled so that mypy sees a class

from pytest_shutdown.findings.finding import Finding, ShutdownContractError
from pytest_shutdown.findings.text import error_headline
from pytest_shutdown.plugin.guard.state import GuardState, _Watch, line_of
from pytest_shutdown.plugin.pending import warn_at
from pytest_shutdown.plugin.report import TestRecord, render_budget

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.budget import BudgetOutcome

_GUARD_ATTR = "_pytest_shutdown_findings"
#: The report section that carries the guard's findings of a test that already failed.
GUARD_SECTION = "Captured shutdown guard teardown"


class _GuardError(ShutdownContractError, Failed):
    """The guard's teardown error in fail mode, reported by its text as ``pytest.fail(...,
    pytrace=False)`` is: formatting the traceback through pytest's and pluggy's frames cost
    tens of milliseconds per error, and the report shows the findings instead."""

    def __init__(self, findings: list[Finding]) -> None:
        ShutdownContractError.__init__(self, findings)
        self.msg = str(self)
        self.pytrace = False


def _is_pytest_timeout(exc: BaseException | None) -> bool:
    return exc is not None and "from pytest-timeout" in str(exc)


class _ReportsFromWorkers:
    """The xdist controller's per-report hook (:meth:`GuardReports._take_report`)."""

    def __init__(self, guard: GuardReports) -> None:
        self.guard = guard

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.guard._take_report(report)


class GuardReports(GuardState):
    """The report wrapper, the records, and the test's error or warning."""

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A per-report hook on the xdist controller only (elsewhere the wrapper does it)."""
        if self._worker is None and self.config.pluginmanager.hasplugin("dsession"):
            self.config.pluginmanager.register(
                _ReportsFromWorkers(self), "pytest-shutdown-reports-from-workers"
            )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A failure noted; the test's records attached to its teardown report."""
        report = yield
        if call.excinfo is not None:
            from pytest_shutdown.plugin.contract_errors import note_contract_error  # noqa: PLC0415

            note_contract_error(item, call, report)
            self._note_failure(item, call.when, call.excinfo.value, report)
        elif call.when != "teardown":
            return report  # a passed set-up or call: no records, nothing to attach
        if call.when == "teardown":
            self.report.attach_pending(report)
        if self._worker is None:  # the records are this process's own to accept now
            self._take_report(report)
        return report

    def _note_failure(
        self, item: pytest.Item, when: str, error: BaseException, report: pytest.TestReport
    ) -> None:
        watch = self._watch
        if watch is not None and watch.item is item and when != "teardown" and report.failed:
            watch.failed = True
        if watch is not None and _is_pytest_timeout(error):
            watch.timed_out = True
        plain = getattr(error, _GUARD_ATTR, None)
        if when == "teardown" and plain is not None:
            report.longrepr = f"{error_headline(plain)}\n{self._render(plain)}"

    def _take_report(self, report: pytest.TestReport) -> None:
        """Accept the records a teardown report carries; attach the guard's section of a
        teardown to the setup error it follows (pytest prints it after a failed call itself)."""
        self.report.accept_reported(report)
        if report.when == "setup":
            if report.failed:
                self._failed_reports[report.nodeid] = report
            return
        if report.when != "teardown":
            return
        failed = self._failed_reports.pop(report.nodeid, None)
        if failed is not None:
            failed.sections.extend(
                (name, text) for name, text in report.sections if name == GUARD_SECTION
            )

    def _record(
        self,
        item: pytest.Item,
        watch: _Watch,
        findings: list[Finding],
        fired: BudgetOutcome | None,
        guard_error: str | None,
        cut_short: str | None,
        teardown_s: float,
        guard_s: float,
        reported: bool,
    ) -> None:
        """A test that did not end clean: its record, user properties and report sections;
        when it did not fail otherwise (``reported``), the error or the warning."""
        __tracebackhide__ = True
        if fired is not None:
            from pytest_shutdown.plugin.report import budget_finding  # noqa: PLC0415

            findings.insert(0, budget_finding(item.name, fired.to_dict()))
            if fired.killed:
                count = len(fired.killed)
                findings.append(
                    Finding(
                        "force-killed",
                        f"{count} child process{'es' if count != 1 else ''} of {item.name} "
                        f"killed when its {fired.budget_s:g} s shutdown budget ran out.",
                        {"processes": fired.killed, "budget_s": fired.budget_s},
                    )
                )
        plain = [f.to_dict() for f in findings]
        self.report.add(
            TestRecord(
                nodeid=watch.nodeid,
                worker=self.report.worker,
                teardown_s=teardown_s,
                findings=plain,
                budget=fired.to_dict() if fired is not None else None,
                reported=reported,
                guard_s=guard_s,
                guard_error=guard_error,
                cut_short=cut_short,
            )
        )
        for finding in findings:
            item.user_properties.append((f"shutdown:{finding.code}", finding.message))
        if findings and not reported:
            item.add_report_section("teardown", "shutdown guard", self._render(plain))
        if fired is not None:
            item.add_report_section("teardown", "shutdown budget", render_budget(fired.to_dict()))
        if findings and reported:  # (reported: the teardown raised nothing of its own)
            self._complain(item, findings, plain)

    def _complain(self, item: pytest.Item, findings: list[Finding], plain: list[Any]) -> None:
        __tracebackhide__ = True
        if self.settings.mode == "warn":
            warn_at(self._render(plain), line_of(item))
            return
        error = _GuardError(findings)
        setattr(error, _GUARD_ATTR, plain)
        raise error
