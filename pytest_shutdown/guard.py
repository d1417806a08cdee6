"""The guard: per-test and per-fixture accounting of threads, child processes and gc freezes.

For every test (setup, call and teardown together) the guard takes a snapshot before setup and
compares after teardown, using the primitives of :mod:`pytest_shutdown.resources.primitives`.
Whose leak is it (:mod:`pytest_shutdown.ownership.owners`, decided before any grace is waited):
threads and processes started while a fixture of wider scope was being set up, or that its value
reaches, belong to that fixture; they are checked, and blamed on it, when that fixture is torn
down.
Those a module global or class attribute reaches are never a test's leak; the ones still alive
at session end are listed as long-lived resources. The standard library's process-lifetime
helpers and the tools' own threads (pytest-timeout's timer, execnet/xdist, pytest,
pytest-shutdown's watchdogs) are never blamed. Creation sites come from
:mod:`pytest_shutdown.ownership.origins`.

Findings become a :class:`~pytest_shutdown.report.TestRecord` and ``user_properties``; in
``fail`` mode the test errors in teardown with :class:`ShutdownContractError`, in ``warn`` mode a
:class:`ShutdownLeakWarning` is emitted (for what may still end by itself, once its grace ran
out while the next tests run: :mod:`pytest_shutdown.pending`); a test that already failed gets
them as a report section of its failure instead, without a grace wait. In ``fail`` mode
only, the guard then restores order for the next test: the test's own leaked process trees are
killed and a gc freeze left behind is undone (when there was none before). Warn mode changes
nothing in the run. Leaked threads, now part of the next baseline, are not blamed again.
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import time
import types
import warnings
from collections.abc import Generator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import field
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.outcomes import Failed  # pytest.fail.Exception, spelled so that mypy sees a class
from _pytest.scope import Scope

from pytest_shutdown._base.lazy_dataclass import lazy_dataclass
from pytest_shutdown._os.moments import one_moment
from pytest_shutdown.findings.finding import Finding, ShutdownContractError
from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.node_markers import scanned_names_are_hooks
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.containment import Containment
from pytest_shutdown.pending import DeferredLeaks
from pytest_shutdown.report import (
    ShutdownReport,
    TestRecord,
    describe_guard_error,
    render_budget,
    render_findings,
)
from pytest_shutdown.resources import default_kinds
from pytest_shutdown.resources.base import ObjectKind, ResourceKind
from pytest_shutdown.resources.marks import FingerprintPass
from pytest_shutdown.resources.primitives import Started, descendant_pids, thread_name
from pytest_shutdown.resources.threads import TOOL_MODULES, is_tool_thread
from pytest_shutdown.settings import (
    AllowLeaks,
    GuardSettings,
    allow_leaks_of,
    budget_of,
    marker_names,
    shows_details,
)

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.ownership.owners import Owner

__all__ = ["TOOL_MODULES", "ShutdownGuard", "ShutdownLeakWarning", "is_tool_thread"]

#: Seconds the check waits first for the new threads and processes no known owner explains to
#: end by themselves (a queue's feeder thread on its way out, and then its pipe): each level
#: of the ownership search's backward walk it spares is a pass over the whole heap (~10 ms in
#: a suite with numpy loaded).
_BRIEF_S = 0.02
#: Seconds into that wait after which what is still there is searched for an owner (one
#: backward walk): what a module global, a class attribute or a live fixture holds (a
#: library's monitor thread, a reusable executor's workers: the one wait of each of tqdm's,
#: loky's and joblib's suites) is not waited for any longer. Threads and processes on their
#: way out end well within it (1-3 ms for a closed ``multiprocessing.Pool``'s workers and
#: handler threads); the walk it may spend on one that ends later costs a heap pass a level.
_WALK_AFTER_S = 0.01

#: kind name -> a snapshot of that kind
Snapshot = dict[str, Any]
#: kind name -> the items of that kind (objects, or Change records of a state kind)
Found = dict[str, tuple[Any, ...]]


class _GuardError(ShutdownContractError, Failed):
    """The guard's own teardown error in fail mode: a ShutdownContractError that pytest reports
    by its text, as it does ``pytest.fail(..., pytrace=False)``. Its report shows the findings
    (:meth:`ShutdownGuard._note_failure`); the traceback through pytest's and pluggy's frames
    that pytest would otherwise format first, with their source, cost tens of milliseconds per
    error and was thrown away."""

    def __init__(self, findings: list[Finding]) -> None:
        ShutdownContractError.__init__(self, findings)
        self.msg = str(self)
        self.pytrace = False


_FUNCTION_SCOPE = Scope.Function

#: A test's allow_leaks, its budget, and its markers' error (on a worker), for a test without
#: the markers.
_NO_MARKS: tuple[AllowLeaks | None, float | None, str | None] = (None, None, None)

#: After this many quiet gaps in a row (between a clean test's check and the next test's
#: set-up, nothing new for any kind: no reading moved, or the kinds behind those that did, a
#: pid taken on the host, find nothing new since that check), a set-up starts from that check's
#: readings without reading them again (half of the guard's cost on a test that leaves
#: nothing): only the hooks of pytest and its plugins run in a gap, and what they do there is
#: usually nothing or the same before every test (faulthandler's and pytest-timeout's
#: watchdogs, armed before the set-up). Every :data:`_PROBE_EVERY`-th set-up reads anyway; one
#: that finds a gap that was not quiet, or a plugin registered, reads every set-up again until
#: the gaps are quiet again.
_QUIET_GAPS_TRUSTED = 8
_PROBE_EVERY = 8

#: Extra looks of the fail-mode session-end sweep for a process that hopped (forked and
#: exited) between the look and the kill.
_SWEEP_ROUNDS = 5

_PYTEST_TIMEOUT_MARK = "from pytest-timeout"
#: Process groups exist only once torch.distributed is loaded: no lookup per test before.
_C10D = "torch.distributed.distributed_c10d"
_GUARD_ATTR = "_pytest_shutdown_findings"
_GUARD_ERROR_TITLE = "shutdown guard"
#: The report section that carries the guard's findings of a test that already failed.
GUARD_SECTION = "Captured shutdown guard teardown"


def _same(marks: list[Any], others: list[Any]) -> bool:
    """Two lists of fingerprints are equal (identity first, in C); a value whose ``__eq__``
    raises counts as moved."""
    try:
        return bool(marks == others)
    except Exception:  # noqa: BLE001 - a hostile __eq__ in process-wide state
        return False


def _fingerprinted_by_others(kind: ResourceKind, on: Mapping[str, ResourceKind]) -> bool:
    """Whether the kinds ``kind`` names in ``fingerprinted_by`` are all on (their fingerprints
    then move whenever its own would)."""
    others = getattr(kind, "fingerprinted_by", ())
    return bool(others) and all(name in on for name in others)


def _is_pytest_timeout(exc: BaseException | None) -> bool:
    return exc is not None and _PYTEST_TIMEOUT_MARK in str(exc)


# The helpers below import their modules on first use: a clean session raises no
# ShutdownContractError and, without torch.distributed, has no process group to look at.
def note_contract_error(item: pytest.Item, call: pytest.CallInfo[None], report: Any) -> None:
    from pytest_shutdown.contract_errors import note_contract_error as note  # noqa: PLC0415

    note(item, call, report)


def group_names() -> frozenset[str]:
    from pytest_shutdown.helpers.process_groups import group_names as names  # noqa: PLC0415

    return names()


def process_group_findings(subject: str, before: frozenset[str]) -> list[Finding]:
    from pytest_shutdown.helpers.process_groups import (  # noqa: PLC0415
        process_group_findings as findings,
    )

    return findings(subject, before)


@lazy_dataclass
class _Owned:
    """What a wider-scope fixture's setup started (object kinds) and the state before it (state
    kinds): checked, and blamed on the fixture, when it is torn down."""

    fixture: str
    scope: str
    baseid: str
    started: Found
    state_before_setup: Snapshot
    state_after_setup: Snapshot = field(default_factory=dict)
    state_at_teardown: Snapshot | None = None

    def owner(self) -> dict[str, str]:
        return {"fixture": self.fixture, "scope": self.scope, "baseid": self.baseid}

    def subject(self) -> str:
        return f"fixture {self.fixture!r} ({self.scope} scope)"

    def adopt(self, kind: str, items: tuple[Any, ...]) -> None:
        """Items a test started that this fixture's value reaches: checked, and blamed on the
        fixture, at its teardown."""
        self.started[kind] = self.started.get(kind, ()) + items


class _Watch:
    """The guard's state for the test being run. ``before`` is each kind's baseline, with what
    wider-scope fixtures did during the test's set-up and teardown absorbed into it. (A plain
    class: one is made per test, and a dataclass's generated methods cost 0.5 ms to make.)"""

    __slots__ = ("item", "before", "marks", "allow", "budget_s", "finished", "timed_out",
                 "failed", "groups_before", "gap_unread", "nodeid")

    def __init__(
        self,
        item: pytest.Item,
        before: Snapshot,
        allow: AllowLeaks | None,
        budget_s: float,
        groups_before: frozenset[str] = frozenset(),
        marks: list[Any] | None = None,
    ) -> None:
        self.item = item
        self.nodeid = item.nodeid  # a property (a str() call each time): read once
        self.before = before
        #: Each kind's fingerprint when ``before`` was taken; None once a wider-scope fixture's
        #: doing was absorbed into ``before`` (then the check asks every kind).
        self.marks = marks
        self.allow = allow
        self.budget_s = budget_s
        self.finished: list[tuple[_Owned, Snapshot]] = []
        self.timed_out = False
        self.failed = False
        #: The torch.distributed process groups initialised before the test (usually none).
        self.groups_before = groups_before
        #: ``before`` is the last clean check's, the gap since then not read (_QUIET_GAPS_TRUSTED)
        self.gap_unread = False


class _ReportsFromWorkers:
    """The xdist controller's per-report hook: accept the records a worker's teardown report
    carries, attach the guard's section of a teardown to the setup error it follows."""

    def __init__(self, guard: ShutdownGuard) -> None:
        self.guard = guard

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.guard._take_report(report)


@scanned_names_are_hooks
class ShutdownGuard:
    """The pytest plugin object registered when the guard is on (by the plugin module)."""

    def __init__(
        self, config: pytest.Config, settings: GuardSettings, report: ShutdownReport
    ) -> None:
        self.config = config
        self.settings = settings
        self.report = report
        #: The resource kinds walked after every test, in the order their findings are listed.
        self.kinds: list[ResourceKind] = default_kinds(settings.resources, settings=settings)
        self._objects = [k for k in self.kinds if not k.stateful]
        self._allowed_late = {}
        #: ``(kind, item)`` keys whose owner search in this check was cut short by its bounds:
        #: reported, never stopped (fail mode kills only what is certainly the test's).
        self._uncertain: set[tuple[str, Any]] = set()
        for kind in self._objects:
            if _finds_late(kind):  # the guard keeps the current test: late items are told apart
                kind.track_late = True  # type: ignore[attr-defined]
        self._states = [k for k in self.kinds if k.stateful]
        self._by_name = {k.name: k for k in self.kinds}
        #: The kinds whose fingerprints the fast path compares: not one whose fingerprint is
        #: made of readings other kinds on this run compare already.
        self._marks = FingerprintPass(
            [k for k in self.kinds if not _fingerprinted_by_others(k, self._by_name)]
        )
        #: kind -> the kinds whose fingerprints stand for its own (the ports kind's)
        self._covered = {
            k.name: tuple(getattr(k, "fingerprinted_by", ()))
            for k in self.kinds
            if _fingerprinted_by_others(k, self._by_name)
        }
        self._watch: _Watch | None = None
        #: id(item) -> its allow_leaks, budget and markers' error, for the tests with markers
        #: (the collected items live as long as the session: their ids are theirs)
        self._marked: dict[int, tuple[AllowLeaks | None, float | None, str | None]] = {}
        #: The xdist worker's id, None in the session's own process (or on the controller).
        self._worker = self.report.worker
        #: The last clean test's fingerprints (after its teardown) and baseline: the next test
        #: starts from that baseline when its fingerprints have not moved since.
        self._clean: tuple[list[Any], Snapshot] | None = None
        #: Gaps in a row (a clean check to the next set-up) in which no reading moved, and the
        #: set-ups so far: see _QUIET_GAPS_TRUSTED.
        self._quiet_gaps = 0
        self._setups = 0
        self._owned: dict[Any, _Owned] = {}
        #: (kind, item) owned by a module global or class attribute -> what the report says.
        self._long_lived: dict[Any, dict[str, Any]] = {}
        #: Failed setup/call reports by node id, to attach the teardown's findings to.
        self._failed_reports: dict[str, pytest.TestReport] = {}
        origins.install()
        #: Environment marker (+ subreaper, opt-in): nothing a test starts hides by being
        #: re-parented.
        self.containment = Containment().engage(subreaper=settings.containment == "subreaper")
        with one_moment():  # opens the readings' handles now, not inside the first test
            for kind in self.kinds:
                kind.fingerprint()
        #: What was running before any test: never swept at session end.
        self._session_start_pids = descendant_pids()
        self._session_start_threads = set(threading.enumerate())
        #: Non-daemon threads tests left, alive at session end: they would block the exit.
        self._blocking_exit: list[threading.Thread] = []
        #: Warn mode: a test's candidate leaks, confirmed once their grace ran out while the
        #: next tests run (:mod:`pytest_shutdown.pending`); fail mode waits the grace.
        self._deferred = (
            DeferredLeaks(settings.grace_s, report, self._render, ShutdownLeakWarning)
            if settings.mode == "warn"
            else None
        )

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        origins.uninstall()
        origins.set_current_test(None)
        self.containment.release()
        for kind in self.kinds:  # a kind that installed something (a recorder) removes it
            close = getattr(kind, "close", None)
            if callable(close):
                close()
        if self._blocking_exit and self.settings.mode == "fail":
            # The report and the record log are written (the report plugin's sessionfinish).
            from pytest_shutdown.exit_bound import bound_the_exit  # noqa: PLC0415

            bound_the_exit(self._blocking_exit, self.settings.grace_s, self._exitstatus)

    def pytest_plugin_registered(self) -> None:
        """A plugin registered during the run may act between tests: read the gaps again."""
        self._quiet_gaps = 0

    # --- collection: markers are validated once, here ---

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Validate the markers: a bad one is a usage error (exit code 4). On an xdist worker,
        where a usage error would only crash the worker, the test errors in setup instead.

        Last: the markers a conftest adds in its own ``pytest_collection_modifyitems`` count,
        and the tests ``-k`` or ``-m`` deselected are not asked (a bad marker written on the
        function is a collection error before this, deselected or not)."""
        on_worker = hasattr(self.config, "workerinput")
        for item in items:
            names = marker_names(item)
            if "allow_leaks" not in names and "shutdown_budget" not in names:
                continue  # the defaults: set-up takes them when nothing is kept for it
            marks: tuple[AllowLeaks | None, float | None, str | None]
            try:
                marks = (allow_leaks_of(item), budget_of(item, self.settings.budget_s), None)
            except pytest.UsageError as exc:
                if not on_worker:
                    raise
                marks = (None, None, str(exc))
            self._marked[id(item)] = marks

    # --- the test ---

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        allow, budget, marker_error = (
            self._marked.get(id(item), _NO_MARKS) if self._marked else _NO_MARKS
        )
        clean = self._clean
        self._setups += 1
        if (
            clean is not None
            and self._quiet_gaps >= _QUIET_GAPS_TRUSTED
            and self._setups % _PROBE_EVERY
        ):
            marks, before = clean[0], dict(clean[1])  # the gap is trusted: see _QUIET_GAPS_TRUSTED
            gap_unread = True
        else:
            gap_unread = False
            marks = self._marks.read()
            if clean is None:
                before = self._snapshot(self.kinds)
            elif _same(clean[0], marks):
                before = dict(clean[1])  # nothing moved since the last clean test ended
                self._quiet_gaps += 1
            else:  # a reading moved: quiet still when what the kinds behind it see did not
                moved = self._moved(clean[0], marks, clean[1])
                with one_moment():
                    before = self._snapshot_since(clean[1], moved)
                    quiet = moved is not None and not any(
                        tuple(self._by_name[name].new_since(clean[1][name])) for name in moved
                    )
                self._quiet_gaps = self._quiet_gaps + 1 if quiet else 0
        self._watch = _Watch(
            item,
            before,
            allow,
            self.settings.budget_s if budget is None else budget,
            groups_before=group_names() if _C10D in sys.modules else frozenset(),
            marks=marks,
        )
        self._watch.gap_unread = gap_unread
        if not gap_unread:  # the set-up's readings may have found an earlier test's late leak
            self._report_late()
        origins.set_current_test(self._watch.nodeid)
        if marker_error is not None:  # the watch is set: its teardown finds what it expects
            pytest.fail(marker_error, pytrace=False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """The one report wrapper of the plugin with the guard on: a failure noted, the
        guard's own error shown as findings, a ShutdownContractError's codes and findings
        recorded (:mod:`pytest_shutdown.contract_errors`), then the test's records attached to
        its teardown report (:meth:`ShutdownReport.attach_pending`)."""
        report = yield
        if call.excinfo is not None:
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
            # The guard's own error: show the findings, not the guard's source.
            codes = ", ".join(dict.fromkeys(f["code"] for f in plain))
            report.longrepr = f"{_GUARD_ERROR_TITLE}: {codes}\n{self._render(plain)}"

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        watch = self._watch
        if watch is None or watch.item is not item:
            return (yield)
        start = time.monotonic()
        budget = None
        if watch.budget_s > 0:
            from pytest_shutdown.budget import TeardownBudget  # noqa: PLC0415 - only with a budget

            budget = TeardownBudget(
                watch.budget_s, watch.nodeid, on_expire=lambda: self._kill_children(watch)
            )
        error: BaseException | None = None
        result: object = None
        try:
            if budget is None:
                result = yield
            else:
                with budget:
                    result = yield
        except (KeyboardInterrupt, pytest.exit.Exception):
            self._watch = None
            raise
        except BaseException as exc:
            error = exc
        self._watch = None
        if error is not None and _is_pytest_timeout(error):
            watch.timed_out = True
        cut_short = None
        if isinstance(error, SystemExit):
            # pytest reports it as the test's teardown error, skips the finalizers still due
            # and goes on: the test is checked now, without a grace wait, and recorded.
            watch.failed = True
            cut_short = f"SystemExit({error.code!r}) in its teardown"
        fired = budget.outcome if budget is not None and budget.outcome.fired else None
        guard_start = time.monotonic()
        guard_error = None
        try:  # (the test is still the current one while its check runs: see _note_late)
            findings = self._check(watch)
            if watch.groups_before or _C10D in sys.modules:
                findings += process_group_findings(f"test {item.name}", watch.groups_before)
        except Exception as exc:  # noqa: BLE001 - the guard's own failure is not the test's
            findings, guard_error = [], describe_guard_error(exc)
        origins.set_current_test(None)
        guard_s = time.monotonic() - guard_start
        teardown_s = time.monotonic() - start  # the grace waited is part of the teardown
        if self._deferred is not None and self._deferred.due():  # earlier tests' verdicts
            self._deferred.confirm_due()
        if fired is not None:
            from pytest_shutdown.report import budget_finding  # noqa: PLC0415

            findings.insert(0, budget_finding(item.name, fired.to_dict()))
        if fired is not None and fired.killed:
            count = len(fired.killed)
            findings.append(
                Finding(
                    "force-killed",
                    f"{count} child process{'es' if count != 1 else ''} of {item.name} killed "
                    f"when its {fired.budget_s:g} s shutdown budget ran out.",
                    {"processes": fired.killed, "budget_s": fired.budget_s},
                )
            )
        # A test that already failed is one report: the findings go with its failure.
        reported = error is None and not watch.timed_out and not watch.failed
        if not findings and fired is None and guard_error is None and cut_short is None:
            self.report.add_clean(watch.nodeid, teardown_s, guard_s, reported)
            if error is not None:
                raise error
            return result
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
        if error is not None:
            raise error
        if findings and reported:
            self._complain(item, findings, plain)
        return result

    def _take_report(self, report: pytest.TestReport) -> None:
        """A finished phase's report (this process's own, or a worker's on the controller):
        accept the records its teardown report carries, and attach the guard's section of a
        teardown to the setup error it follows. A failed call needs none: pytest prints the
        teardown sections after each failure itself, and the section would then be printed
        twice."""
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

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """On the xdist controller the reports arrive one by one, with the workers' records:
        a per-report hook there only (elsewhere the teardown report wrapper does its work,
        one hook call per phase fewer)."""
        if self._worker is None and self.config.pluginmanager.hasplugin("dsession"):
            self.config.pluginmanager.register(
                _ReportsFromWorkers(self), "pytest-shutdown-reports-from-workers"
            )

    def _render(self, plain: list[Any]) -> str:
        return render_findings(plain, details=shows_details(self.config))

    def _complain(self, item: pytest.Item, findings: list[Finding], plain: list[Any]) -> None:
        __tracebackhide__ = True
        if self.settings.mode == "warn":
            # attributed to the test's own line, not to this module
            path, lineno, _ = item.reportinfo()
            warning = ShutdownLeakWarning(self._render(plain))
            with warnings.catch_warnings():
                # Warn mode never fails a test: under -W error / filterwarnings = error the
                # warning is still recorded (pytest's recorder stays in place), never raised.
                warnings.simplefilter("always", ShutdownLeakWarning)
                warnings.warn_explicit(warning, ShutdownLeakWarning, str(path), (lineno or 0) + 1)
            return
        error = _GuardError(findings)
        setattr(error, _GUARD_ATTR, plain)
        raise error

    # --- snapshots ---

    @staticmethod
    def _snapshot(kinds: list[ResourceKind]) -> Snapshot:
        with one_moment():  # the kinds share their readings (descendants, fd count ...)
            return {kind.name: kind.snapshot() for kind in kinds}

    def _snapshot_since(self, last: Snapshot, moved: set[str] | None) -> Snapshot:
        """A snapshot that takes ``last``'s of each kind whose readings did not move since it
        (``moved``; None: any may have) and a fresh one of the others."""
        with one_moment():
            return {
                kind.name: kind.snapshot()
                if moved is None or kind.name in moved
                else last[kind.name]
                for kind in self.kinds
            }

    # --- wider-scope fixtures own what their setup started ---

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        watch = self._watch
        if (
            watch is None
            or getattr(fixturedef, "_scope", None) is _FUNCTION_SCOPE
            or fixturedef.scope == "function"  # (the property builds an enum's value)
        ):
            return (yield)
        start = self._snapshot(self.kinds)
        try:
            return (yield)
        finally:
            started: Found = {}
            for kind in self._objects:
                items = tuple(kind.new_since(start[kind.name]))
                if items:
                    started[kind.name] = items
            owned = _Owned(
                fixturedef.argname,
                fixturedef.scope,
                fixturedef.baseid,
                started,
                {kind.name: start[kind.name] for kind in self._states},
            )
            self._owned[fixturedef] = owned
            end = self._snapshot(self._states)
            owned.state_after_setup = end
            watch.marks = None
            for kind in self.kinds:  # what its set-up started or changed is not the test's
                if watch.before.get(kind.name) is not None:
                    watch.before[kind.name] = kind.absorb(
                        watch.before[kind.name], start[kind.name], end.get(kind.name)
                    )

            def teardown_started() -> None:
                owned.state_at_teardown = self._snapshot(self._states)
                _its_own_to_stop(owned)

            # Finalizers run last-in first-out: this one runs before the fixture's own teardown.
            fixturedef.addfinalizer(teardown_started)

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owned = self._owned.pop(fixturedef, None)
        if owned is None:
            return
        now = self._snapshot(self._states)
        watch = self._watch
        if watch is None:  # torn down outside any test (e.g. an interrupted session)
            self._finish_orphan(owned, now)
            return
        # Whatever the fixture's teardown changed is the fixture's.
        watch.marks = None
        at_teardown = owned.state_at_teardown if owned.state_at_teardown is not None else now
        for kind in self._states:
            watch.before[kind.name] = kind.absorb(
                watch.before[kind.name], at_teardown[kind.name], now[kind.name]
            )
        watch.finished.append((owned, now))

    def _finish_orphan(self, owned: _Owned, state_now: Snapshot) -> None:
        deadline = time.monotonic() + self.settings.grace_s
        left = {
            kind.name: tuple(kind.settle(owned.started.get(kind.name, ()), deadline))
            for kind in self._objects
        }
        findings = self._owned_findings(owned, left, state_now)
        if findings:
            self.report.add(
                TestRecord(
                    nodeid=f"<fixture {owned.fixture}>",
                    worker=self.report.worker,
                    teardown_s=0.0,
                    findings=[f.to_dict() for f in findings],
                )
            )

    def _owned_findings(
        self, owned: _Owned, left: Found, state_now: Snapshot, grace: float | None = None
    ) -> list[Finding]:
        """The fixture's findings (what it left of each kind), then, in fail mode, order
        restored for what it owns."""
        grace = self.settings.grace_s if grace is None else grace
        extra = {"owner": owned.owner()}
        findings: list[Finding] = []
        restore: list[tuple[ResourceKind, tuple[Any, ...]]] = []
        for kind in self.kinds:
            if kind.stateful:
                items = self._fixture_state_left(kind, owned, state_now)
            else:
                items = self._not_kept_by_libraries(kind, owned, left.get(kind.name, ()))
            if items:
                findings.extend(kind.findings(items, owned.subject(), grace=grace, extra=extra))
                restore.append((kind, items))
        if self.settings.mode == "fail":
            for kind, items in restore:
                kind.restore(items)
        return findings

    def _not_kept_by_libraries(
        self, kind: ResourceKind, owned: _Owned, items: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        """``items`` less what a loaded native library keeps for the process's lifetime (the
        kind's ``kept_by_libraries``: Ray's gRPC pollers and log files after ``ray.shutdown()``):
        opened by the fixture's set-up, open for good whatever its teardown does, with no
        Python object to close. Listed as long-lived at session end, not a finding."""
        kept_by = getattr(kind, "kept_by_libraries", None)
        if not items or kept_by is None:
            return items
        kept = kept_by(items)
        for item, library in kept.items():
            key = (kind.name, item)
            if key not in self._long_lived:
                what = item.long_lived() if hasattr(item, "long_lived") else {"kind": kind.name}
                self._long_lived[key] = {
                    **what,
                    "owner": {"kind": "native library", "name": library, "path": ""},
                    "first_test": owned.subject(),
                    "started_at": None,
                }
        return tuple(i for i in items if i not in kept) if kept else items

    def _left(
        self,
        watch: _Watch,
        allowed: set[str],
        moved: set[str] | None,
        asked: Found,
        walked: AbstractSet[tuple[str, Any]] = frozenset(),
    ) -> Found | None:
        """What the test left that is its own (inside one moment): each kind's new items less
        what a live fixture started or anything that outlives the test owns; None when there
        is nothing to wait for or report. ``allowed`` gets the kinds the markers allow; only
        the kinds in ``moved`` are asked (all when None), and those in ``asked`` (by
        :meth:`_new_since`, in this moment) are not asked again; the ``(kind, item)`` keys in
        ``walked`` were searched for an owner moments ago and had none."""
        found: Found = {}
        allow = watch.allow
        later: list[tuple[ResourceKind, Any]] = []
        for kind in self.kinds:
            if moved is not None and kind.name not in moved:
                continue
            allowance = allow.allowance(kind.allow_key) if allow is not None else None
            if allowance is True:
                allowed.add(kind.name)
                # what leaves the tree later is allowed too (the session-end sweep lists it)
                self._allowed_late.setdefault(watch.nodeid, set()).add(kind.name)
                continue
            if not getattr(kind, "ends_by_itself", False):
                later.append((kind, allowance))
                continue
            items = asked.get(kind.name)
            if items is None:
                items = self._new_in_test(watch, kind, allowance)
            if items:
                found[kind.name] = tuple(items)
        # Whose is it? Decided before any wait, so that what others own costs no grace. The
        # threads and processes first: a global found owning a pool's workers is remembered,
        # and the kinds asked next find the pool's pipes forwards from it, with no heap scan.
        nodeid = watch.nodeid
        left = self._without_owned(self._not_live_owned(found), nodeid, walked) if found else {}
        rest: Found = {}
        for kind, allowance in later:
            items = tuple(kind.new_since(watch.before[kind.name], allowance))
            if items:
                rest[kind.name] = items
        if not found and not rest and not watch.finished:
            return None
        if rest:
            left.update(self._without_owned(self._not_live_owned(rest), nodeid))
        return left

    def _not_live_owned(self, found: Found) -> Found:
        """``found`` less what a live fixture started (checked at the fixture's teardown)."""
        live_owned = self._live_owned()
        return {
            name: tuple(i for i in items if i not in live_owned[name])
            if name in live_owned
            else items
            for name, items in found.items()
        }

    def _live_owned(self) -> dict[str, set[Any]]:
        live_owned: dict[str, set[Any]] = {}
        for owned in self._owned.values():
            for name, items in owned.started.items():
                live_owned.setdefault(name, set()).update(items)
        return live_owned

    def _new_since(self, watch: _Watch, moved: set[str] | None) -> Found:
        """The new items of the kinds whose items end by themselves (threads, processes), each
        asked once: empty for a kind that found nothing, absent for one not asked (its marks
        did not move, or the markers allow it anything)."""
        allow = watch.allow
        asked: Found = {}
        for kind in self._objects:
            if not getattr(kind, "ends_by_itself", False):
                continue
            if moved is not None and kind.name not in moved:
                continue
            allowance = allow.allowance(kind.allow_key) if allow is not None else None
            if allowance is not True:
                asked[kind.name] = self._new_in_test(watch, kind, allowance)
        return asked

    @staticmethod
    def _new_in_test(watch: _Watch, kind: ResourceKind, allowance: Any) -> tuple[Any, ...]:
        """A kind's new items; when the gap before the test was not read, less those whose
        recorded start was outside any test (in that gap: what a set-up reading would have
        put in the baseline)."""
        items = tuple(kind.new_since(watch.before[kind.name], allowance))
        outside = getattr(kind, "started_outside_tests", None) if watch.gap_unread else None
        if items and outside is not None:
            between = outside(items)
            if between:
                items = tuple(i for i in items if i not in between)
        return items

    def _leaving(self, asked: Found) -> Found:
        """Of the new threads and processes ``asked``, those no live fixture started and no
        known owner explains without a heap pass: those that end within a few milliseconds
        need no ownership search at all."""
        found: Found = {name: items for name, items in asked.items() if items}
        targets = self._targets(found)
        if not found:
            return found
        live_owned = self._live_owned()
        owners: Mapping[Any, object] = {}
        if targets:
            from pytest_shutdown.ownership.owners import find_owners  # noqa: PLC0415 - only when found

            owners = find_owners(targets, self._fixture_roots(), walk=False)
        leaving = {
            name: tuple(
                i for i in items if i not in live_owned.get(name, ()) and (name, i) not in owners
            )
            for name, items in found.items()
        }
        return {name: items for name, items in leaving.items() if items}

    def _let_go(self, leaving: Found, wait_s: float) -> set[tuple[str, Any]]:
        """Wait up to ``wait_s`` (short polls) for the ``leaving`` items to end; once some
        did, collect the young generations: what they held (a queue's pipe) is garbage now.

        What is still there after :data:`_WALK_AFTER_S` is searched for an owner once: what
        has one is not waited for (the check finds that owner again, forwards, without a heap
        pass). Returns the ``(kind, item)`` keys that search left unowned, so that the check
        does not walk the heap for them a second time."""
        start = time.monotonic()
        deadline = start + wait_s
        walk_at = start + min(_WALK_AFTER_S, wait_s)
        unowned: set[tuple[str, Any]] = set()
        walked = ended = False
        delay = 0.001
        while True:
            for name, items in list(leaving.items()):
                left = self._by_name[name].still_there(items)  # type: ignore[attr-defined]
                ended = ended or len(left) < len(items)
                if left:
                    leaving[name] = tuple(left)
                else:
                    del leaving[name]
            now = time.monotonic()
            if leaving and not walked and now >= walk_at:
                walked = True
                unowned = self._stop_waiting_for_owned(leaving)
                now = time.monotonic()
            if not leaving or now >= deadline:
                break
            time.sleep(min(delay, (deadline if walked else walk_at) - now))
            delay = min(delay * 2, 0.008)
        if ended:
            gc.collect(1)
        return unowned

    def _targets(
        self, found: Found, walked: AbstractSet[tuple[str, Any]] = frozenset()
    ) -> dict[Any, object]:
        """``(kind name, item)`` -> the object that stands for the item in an ownership search
        (a thread, a ``Process``/``Popen``, a descriptor's wrapper), for the object kinds in
        ``found``, less the keys in ``walked``."""
        targets: dict[Any, object] = {}
        for kind in self._objects:
            items = found.get(kind.name)
            if items:
                for item, obj in kind.targets(items).items():
                    if (kind.name, item) not in walked:
                        targets[(kind.name, item)] = obj
        return targets

    def _known_referrers(self, targets: Mapping[Any, object]) -> dict[Any, Sequence[object]]:
        """``(kind name, item)`` -> objects known to refer to its target (the kinds'
        optional ``known_referrers``), for the ownership search's first heap pass."""
        near: dict[Any, Sequence[object]] = {}
        for kind in self._objects:
            known = getattr(kind, "known_referrers", None)
            items = [item for name, item in targets if name == kind.name]
            if known is not None and items:
                near.update(((kind.name, item), objs) for item, objs in known(items).items())
        return near

    def _stop_waiting_for_owned(self, leaving: Found) -> set[tuple[str, Any]]:
        """Drop from ``leaving`` what an ownership search (with its backward walk) finds an
        owner for; return the keys of what it walked for and left unowned."""
        targets = self._targets(leaving)
        if not targets:
            return set()
        from pytest_shutdown.ownership.owners import find_owners  # noqa: PLC0415 - only when left

        owners = find_owners(targets, self._fixture_roots(), near=self._known_referrers(targets))
        self._uncertain |= owners.uncertain
        for name, items in list(leaving.items()):
            kept = tuple(i for i in items if (name, i) not in owners)
            if kept:
                leaving[name] = kept
            else:
                del leaving[name]
        return {key for key in targets if key not in owners}

    @staticmethod
    def _fixture_state_left(
        kind: ResourceKind, owned: _Owned, state_now: Snapshot
    ) -> tuple[Any, ...]:
        """What the fixture's set-up or teardown changed and is still not as before its set-up
        (what tests changed in between was theirs, reported with them)."""
        before = owned.state_before_setup[kind.name]
        mine = {c.key for c in kind.diff(before, owned.state_after_setup.get(kind.name, before))}
        at_teardown = (owned.state_at_teardown or {}).get(kind.name)
        if at_teardown is not None:
            mine |= {c.key for c in kind.diff(at_teardown, state_now[kind.name])}
        if not mine:
            return ()
        return tuple(c for c in kind.diff(before, state_now[kind.name]) if c.key in mine)

    # --- checking and restoring order ---

    def _check(self, watch: _Watch) -> list[Finding]:
        allowed: set[str] = set()
        self._uncertain = set()
        # One moment up to the grace: the kinds share their readings (the fd kind its heap
        # scan for the descriptors' wrappers, between new_since and the ownership search);
        # a second one after a brief wait for new threads and processes on their way out.
        before = watch.before
        marks = self._marks.read()  # before any kind's reading below: never the newer one
        if watch.marks is not None and _same(marks, watch.marks):
            self._clean = (marks, before)  # the common case: not one reading moved
            return []
        # A kind whose fingerprint did not move has nothing new: only the others are asked.
        moved = self._moved(watch.marks, marks, before)
        if moved is not None and not moved and not watch.finished:
            # Only readings no kind answers by moved (a pid allocated to a thread of this
            # process's, started and joined by the test): clean, from the same baseline.
            self._clean = (marks, before)
            return []
        self._clean = None
        # Warn mode waits for nothing, not even the brief wait: what is on its way out is
        # dropped when its deferred verdict comes (pending.py).
        waits = not (watch.timed_out or watch.failed or self._deferred is not None)
        brief_s = min(_BRIEF_S, self.settings.grace_s) if waits else 0.0
        leaving: Found = {}
        left: Found | None = None
        with one_moment():
            asked = self._new_since(watch, moved)
            if brief_s > 0:
                leaving = self._leaving(asked)
            if not leaving:
                left = self._left(watch, allowed, moved, asked)
                if left is None:
                    # Nothing new (a thread started and joined, a pid allocated on the host):
                    # the next test starts from what is here now while the marks, read before
                    # these snapshots, have not moved; the snapshots share this moment's
                    # readings.
                    self._clean = (marks, self._snapshot_since(before, moved))
        if leaving:  # outside the moment: what they held is read afresh once they ended
            walked = self._let_go(leaving, brief_s)
            with one_moment():  # asked afresh: what ended took its pipes with it
                left = self._left(watch, allowed, moved, {}, walked)
        if left is None:
            return []  # the common case: nothing to wait for, nothing to report
        found: Found = left
        fixtures: Found = {}
        for owned, _ in watch.finished:
            for name, items in owned.started.items():
                fixtures[name] = fixtures.get(name, ()) + items
        now = time.monotonic()
        alive: dict[str, set[Any]] = {}
        if watch.timed_out or watch.failed or self._deferred is not None:
            # The test already failed (or timed out): no grace for its own leftovers, which go
            # with its failure. Warn mode waits for them neither: they are confirmed once their
            # grace ran out, while the next tests run (deferred below). Fixtures torn down here
            # still get theirs.
            grace = 0.0 if watch.timed_out or watch.failed else self.settings.grace_s
            deadline = now + self.settings.grace_s
            for kind in self._objects:
                mine = kind.settle(found.get(kind.name, ()), now) if kind.name in found else ()
                theirs = kind.settle(fixtures.get(kind.name, ()), deadline) if fixtures else ()
                alive[kind.name] = set(mine) | set(theirs)
        else:  # one deadline for the test's own leftovers and those of fixtures torn down here
            grace = self.settings.grace_s
            deadline = now + grace
            for kind in self._objects:
                combined = found.get(kind.name, ()) + fixtures.get(kind.name, ())
                alive[kind.name] = set(kind.settle(combined, deadline)) if combined else set()
        findings: list[Finding] = []
        for owned, state_at_finish in watch.finished:
            left = {
                name: tuple(i for i in items if i in alive.get(name, ()))
                for name, items in owned.started.items()
            }
            before_restore = self._snapshot(self._states)
            findings.extend(
                self._owned_findings(owned, left, state_at_finish, 0.0 if watch.timed_out else None)
            )
            after_restore = self._snapshot(self._states)
            for kind in self._states:  # an undo of the fixture's change is not the test's
                watch.before[kind.name] = kind.absorb(
                    watch.before[kind.name], before_restore[kind.name], after_restore[kind.name]
                )
        restore: list[tuple[ResourceKind, tuple[Any, ...]]] = []
        for kind in self.kinds:
            if kind.name in allowed or (moved is not None and kind.name not in moved):
                continue
            if kind.stateful:
                items = tuple(kind.new_since(watch.before[kind.name]))
            else:
                items = tuple(i for i in found.get(kind.name, ()) if i in alive[kind.name])
            if items and self._deferred is not None and not kind.stateful and grace > 0:
                path, lineno, _ = watch.item.reportinfo()
                where = (str(path), (lineno or 0) + 1)
                self._deferred.defer(watch.nodeid, watch.item.name, where, kind, items, now)
            elif items:
                found_now = kind.findings(items, watch.item.name, grace=grace)
                certain = tuple(i for i in items if (kind.name, i) not in self._uncertain)
                if len(certain) < len(items) and self.settings.mode == "fail":
                    note = (  # reported, never stopped: see find_owners
                        f" {len(items) - len(certain)} of them not stopped: their owner search"
                        " was cut short, so they may be a wider fixture's or a global's."
                    )
                    found_now = [
                        Finding(f.code, f.message + note, {**f.details, "not_stopped": True})
                        for f in found_now
                    ]
                findings.extend(found_now)
                if certain:
                    restore.append((kind, certain))
        if self.settings.mode == "fail":  # warn mode changes nothing in the run
            for kind, items in restore:
                kind.restore(items)
        return findings

    def _moved(
        self, before: list[Any] | None, after: list[Any], baseline: Snapshot
    ) -> set[str] | None:
        """The kinds whose fingerprints moved between two readings (None: every kind may have,
        or a wider-scope fixture's doing was absorbed into the baseline); a kind fingerprinted
        by others moved with them unless it says its own reading is still ``baseline``'s."""
        if before is None:
            return None
        moved = self._marks.moved(before, after)
        if moved is not None:
            for name, others in self._covered.items():
                if any(other in moved for other in others) and not self._unmoved_since(
                    name, baseline, moved
                ):
                    moved.add(name)
        return moved

    def _unmoved_since(self, name: str, baseline: Snapshot, moved: set[str]) -> bool:
        unmoved_since = getattr(self._by_name[name], "unmoved_since", None)
        return unmoved_since is not None and bool(unmoved_since(baseline[name], moved))

    def _fixture_roots(self) -> dict[int, tuple[Any, str, object]]:
        """``id`` of each live wider-scope fixture's value (and suspended generator) -> owner."""
        roots: dict[int, tuple[Any, str, object]] = {}
        for fixturedef, owned in self._owned.items():
            name = f"{owned.fixture!r} ({owned.scope} scope)"
            cached = getattr(fixturedef, "cached_result", None)
            if cached is not None and cached[2] is None and gc.is_tracked(cached[0]):
                roots[id(cached[0])] = (fixturedef, name, cached[0])
            for finalizer in list(getattr(fixturedef, "_finalizers", ())):
                if isinstance(finalizer, functools.partial):
                    for arg in finalizer.args:
                        if isinstance(arg, types.GeneratorType):
                            roots[id(arg)] = (fixturedef, name, arg)
        return roots

    def _without_owned(
        self,
        found: Found,
        nodeid: str,
        walked: AbstractSet[tuple[str, Any]] = frozenset(),
    ) -> Found:
        """Drop what outlives the test: a live wider-scope fixture's (checked at its teardown),
        a module global's or class attribute's (listed at session end), the standard library's
        process-lifetime helpers. What is left is the test's own. The keys in ``walked`` are
        not searched again (see :meth:`_let_go`)."""
        targets = self._targets(found, walked)
        if not targets:
            return found
        from pytest_shutdown.ownership.owners import find_owners  # noqa: PLC0415 - only when found

        owners = find_owners(targets, self._fixture_roots(), near=self._known_referrers(targets))
        self._uncertain |= owners.uncertain
        if not owners:
            return found
        for fixturedef, owned in self._owned.items():
            for kind in self._objects:
                adopted = tuple(
                    i
                    for i in found.get(kind.name, ())
                    if _fixture_of(owners.get((kind.name, i))) is fixturedef
                )
                if adopted:
                    owned.adopt(kind.name, adopted)
        for key, owner in owners.items():
            if owner.kind != "fixture" and key not in self._long_lived:
                self._long_lived[key] = _long_lived_record(key, owner, nodeid)
        return {
            name: tuple(i for i in items if (name, i) not in owners)
            for name, items in found.items()
        }

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """List the long-lived resources still alive; with ``--shutdown-long-lived=fail`` (on
        the controller, after the workers' lists are merged) they fail the session. Warn
        mode's pending candidates are confirmed first, with no wait (see pending.py)."""
        if self._deferred is not None and len(self._deferred):
            self._reported_at_end = self._deferred.confirm_all()
        late_finders = [k for k in self._objects if _finds_late(k)]
        if late_finders:  # what left the last tests' trees after their checks
            self._snapshot(late_finders)
            self._report_late()
        now = time.monotonic()
        by_kind: dict[str, list[Any]] = {}
        for name, item in self._long_lived:
            by_kind.setdefault(name, []).append(item)
        alive: set[tuple[str, Any]] = set()
        for name, items in by_kind.items():  # one settle per kind: one collection, not one each
            kind = self._by_name.get(name)
            if kind is None:
                continue
            if hasattr(kind, "settle_long_lived"):  # listed only: no whole-heap collection
                thorough = self.settings.long_lived == "fail"
                left = kind.settle_long_lived(tuple(items), now, thorough=thorough)
            else:
                left = kind.settle(tuple(items), now)
            alive.update((name, item) for item in left)
        for key, record in self._long_lived.items():
            if key in alive:
                self.report.add_long_lived(record)
        self._sweep_session()
        self._note_threads_blocking_exit()
        self._exitstatus = int(session.exitstatus)
        self._long_lived.clear()
        if self._late_failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a late leak found in fail mode
        if hasattr(self.config, "workerinput"):
            return
        if self.settings.long_lived == "fail" and self.report.long_lived:
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    _exitstatus = 0

    def _note_threads_blocking_exit(self) -> None:
        """Non-daemon threads tests leaked (reported as ``thread-leak``) still alive block the
        interpreter's exit (``threading._shutdown`` joins them): say so; fail mode bounds it."""
        from pytest_shutdown.resources.primitives import leak_findings  # noqa: PLC0415

        kind = self._by_name.get("threads")
        tools = getattr(kind, "tools", None)
        from pytest_shutdown.resources.threads import REPORTED  # noqa: PLC0415

        blocking = [
            t
            for t in list(REPORTED)  # a test's leak, not a global's pool (listed as long-lived)
            if t not in self._session_start_threads
            and not t.daemon
            and t.is_alive()
            and t is not threading.current_thread()
            and not isinstance(t, threading._DummyThread)
            and not (tools is not None and tools(t))
        ]
        if not blocking:
            return
        self._blocking_exit = blocking
        findings = leak_findings(Started(tuple(blocking)), grace=0.0, subject="the session")
        plain = [f.to_dict() for f in findings]
        if self.settings.mode == "warn":  # the report says so until the exit is unblocked
            records = [r for f in plain for r in f["details"].get("threads", [])]
            self.report.exit_blocked(
                blocking,
                [
                    {k: r.get(k) for k in ("name", "ident", "started_in", "started_at")}
                    for r in records
                ],
            )
        for finding in plain:
            names = ", ".join(repr(t.name) for t in blocking)
            finding["message"] = (
                f"{len(blocking)} non-daemon thread{'s' if len(blocking) != 1 else ''} started "
                f"by the session's tests still running at session end: {names}; "
                + (
                    f"the exit waits at most the {self.settings.grace_s:g} s grace for "
                    "them instead of hanging."
                    if self.settings.mode == "fail"
                    else "the interpreter's exit will wait for them (forever if they never end)."
                )
            )
        self.report.add_findings("<session end>", plain)

    def _sweep_session(self) -> None:
        """At session end, nothing a test started may remain: descendants started since the
        session began (found however they were re-parented) that no module global owns are
        listed as ``process-leak`` of the session; fail mode kills them. Adopted zombies are
        reaped. Not on the xdist controller (its workers sweep their own)."""
        if self.config.pluginmanager.hasplugin("dsession"):
            return
        from pytest_shutdown.ownership.containment import reap_adopted  # noqa: PLC0415
        from pytest_shutdown.resources.primitives import (  # noqa: PLC0415
            _walk_descendants,
            multiprocessing_helper_pids,
            process_running,
        )
        from pytest_shutdown.resources.processes import (  # noqa: PLC0415
            ProcessKind,
            stop_processes,
        )

        now = descendant_pids()
        if not self.containment.subreaper:  # re-parented ones are found by their marker
            now = now | frozenset(self.containment.stray_marked(now))
        if not now:
            return
        kept = set(self._session_start_pids) | set(multiprocessing_helper_pids())
        for name, item in [*self._long_lived, *self._reported_at_end]:
            # a global's pool, listed as long-lived, or a test's leak just reported with its
            # test (warn mode, pending.py): not listed again
            if name == "processes":
                kept.add(item)
                kept.update(_walk_descendants(item) or ())
        left = tuple(sorted(p for p in now - kept if process_running(p)))
        reap_adopted(now - set(left))
        if not left:
            return
        findings = ProcessKind().findings(left, "the session's tests", grace=0.0)
        plain = [f.to_dict() for f in findings]
        for finding in plain:
            procs = finding["details"].get("processes", [])
            described = ", ".join(f"{r['pid']} ({r['name'] or '?'})" for r in procs)
            count = len(procs)
            finding["message"] = (
                f"{count} process{'es' if count != 1 else ''} started by the session's tests "
                f"still running at session end: {described}"
                + ("; killed." if self.settings.mode == "fail" else ".")
            )
        self.report.add_findings("<session end>", plain)
        if self.settings.mode == "fail":
            stop_processes(left, why="the session-end sweep (fail mode)")
            # A fork-and-exit hopper may have hopped between the look and the kill: look again
            # (a few rounds, each one pass), and stop what still carries the marker.
            for _ in range(_SWEEP_ROUNDS):
                again = frozenset(self.containment.stray_marked(kept)) - kept
                again = frozenset(p for p in again if process_running(p))
                if not again:
                    break
                stop_processes(sorted(again), why="the session-end sweep (fail mode)")

    _late_failures = 0
    #: Warn mode: ``(kind name, item)`` of the last tests' leaks reported at session end.
    _reported_at_end: AbstractSet[tuple[str, Any]] = frozenset()
    #: node id -> the kinds its markers allow anything (``allow_leaks(processes=True)``): what
    #: is found of them after the test is allowed too.
    _allowed_late: dict[str, set[str]]

    def _report_late(self) -> None:
        """Report what the kinds found after the test that made it had ended (a launcher that
        daemonises after a delay): a record for that test, a warning in warn mode; fail mode
        stops it and the session fails."""
        for kind in self._objects:
            if not _finds_late(kind):
                continue
            late_items = getattr(kind, "late_items")  # noqa: B009 - optional, see _finds_late
            for nodeid, items in late_items().items():
                if kind.name in self._allowed_late.get(nodeid, ()):
                    continue  # its test allowed such leaks
                name = nodeid.rpartition("::")[2] or nodeid
                plain = [
                    f.to_dict()
                    for f in kind.findings(items, name, grace=0.0, extra={"found_late": True})
                ]
                for finding in plain:
                    finding["message"] = finding["message"].replace(
                        "(no grace was given)", "after the test had ended"
                    ) + (
                        " It left the test's tree later and was found by the test's name in its"
                        " environment" + ("; stopped." if self.settings.mode == "fail" else ".")
                    )
                self.report.add_findings(nodeid, plain)
                if self.settings.mode == "fail":
                    kind.restore(items)
                    self._late_failures += 1
                else:
                    warnings.warn(
                        ShutdownLeakWarning(f"leaked by {nodeid}: " + self._render(plain)),
                        stacklevel=1,
                    )

    def _kill_children(self, watch: _Watch) -> list[dict[str, Any]]:
        """On budget expiry: kill the test's child processes (not those of live fixtures)."""
        from pytest_shutdown.resources.primitives import kill_process_trees  # noqa: PLC0415
        from pytest_shutdown.resources.processes import ProcessKind, parent_pids  # noqa: PLC0415

        kind = self._by_name.get("processes")
        processes = kind if isinstance(kind, ProcessKind) else ProcessKind()
        before = watch.before.get("processes", frozenset())
        started = processes.new_since(before)
        owned = {p for o in self._owned.values() for p in o.started.get("processes", ())}
        owned.update(item for name, item in self._long_lived if name == "processes")
        pids = tuple(p for p in started if p not in owned)
        if pids:  # a pool a fixture value or a global reaches is not the test's to kill
            from pytest_shutdown.ownership.owners import find_owners, objects_of  # noqa: PLC0415

            others = find_owners(  # bounded: it runs in the signal handler, the budget over
                objects_of((), pids, parent_pids(pids)), self._fixture_roots(), max_seconds=1.0
            )
            pids = tuple(p for p in pids if p not in others)
        return (
            kill_process_trees(pids, timeout=2.0, why=f"the shutdown budget of {watch.nodeid}")
            if pids
            else []
        )


def _finds_late(kind: ResourceKind) -> bool:
    """Whether the kind reports items after their test ended (``late_items``, optional)."""
    return getattr(type(kind), "late_items", ObjectKind.late_items) is not ObjectKind.late_items


def _its_own_to_stop(owned: _Owned) -> None:
    """A wider-scope fixture's teardown is about to run: the processes it owns (started in its
    set-up, or adopted since because its value reaches them) and their descendants are its own
    to stop, ``proc.terminate()`` or ``kill()`` included: such an end is never collateral.
    Only those still running now: one that died before (a test's blanket kill) stays a victim."""
    pids = owned.started.get("processes", ())
    if not pids:
        return
    from pytest_shutdown._os.killer import record_ordered_end, tree_of  # noqa: PLC0415
    from pytest_shutdown.resources.primitives import process_running  # noqa: PLC0415

    tree = [m for pid in pids for m in tree_of(pid) if process_running(m)]
    record_ordered_end(tree, f"the teardown of fixture {owned.fixture!r} ({owned.scope} scope)")


def _fixture_of(owner: Owner | None) -> Any:
    return owner.key if owner is not None and owner.kind == "fixture" else None


def _long_lived_record(key: tuple[str, Any], owner: Owner, nodeid: str) -> dict[str, Any]:
    """What the summary says about a thread or process owned by a global (at session end)."""
    item = key[1]
    if isinstance(item, threading.Thread):
        origin = origins.origin_of_thread(item)
        what: dict[str, Any] = {"kind": "thread", "name": thread_name(item), "ident": item.ident}
    elif hasattr(item, "long_lived"):  # an OS resource (fd, port, shm segment)
        origin = None
        what = item.long_lived()
    elif not isinstance(item, int):
        origin = getattr(item, "origin", None)
        describe = getattr(item, "describe", None)
        what = {"kind": key[0], "name": describe() if callable(describe) else repr(item)}
    else:
        origin = origins.origin_of_process(item)
        what = {"kind": "process", "pid": item, "name": origin.what if origin else None}
    return {
        **what,
        "owner": owner.to_dict(),
        "first_test": nodeid,
        "started_at": origins.render_origin(origin) if origin is not None else None,
    }
