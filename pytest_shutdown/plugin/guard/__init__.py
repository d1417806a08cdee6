"""The guard: per-test and per-fixture accounting of every resource kind.

For every test (setup, call and teardown together) the guard snapshots the kinds before setup
and compares after teardown. What a wider-scope fixture's set-up started, or its value reaches,
is that fixture's, checked when it is torn down; what a module global or class attribute
reaches is long-lived, listed at session end (:mod:`pytest_shutdown.plugin.guard.owners`).
Findings become a :class:`~pytest_shutdown.plugin.report.TestRecord`; in ``fail`` mode the test
errors in teardown and order is restored for what is certainly the test's, in ``warn`` mode a
:class:`ShutdownLeakWarning` is emitted once the grace ran out
(:mod:`pytest_shutdown.plugin.pending`) and nothing in the run changes. A test that already
failed gets them as a report section.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown._fast.moments import one_moment
from pytest_shutdown._fast.node_markers import scanned_names_are_hooks
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.ownership import origins
from pytest_shutdown.plugin.guard.owners import WhoseIsIt
from pytest_shutdown.plugin.guard.reports import GUARD_SECTION as GUARD_SECTION
from pytest_shutdown.plugin.guard.reports import GuardReports, _is_pytest_timeout
from pytest_shutdown.plugin.guard.session_end import SessionEnd
from pytest_shutdown.plugin.guard.state import Found, Snapshot, _Watch, line_of
from pytest_shutdown.plugin.quiet import quiet_findings
from pytest_shutdown.plugin.report import describe_guard_error
from pytest_shutdown.plugin.settings import AllowLeaks, allow_leaks_of, budget_of, marker_names
from pytest_shutdown.resources.base import ResourceKind
from pytest_shutdown.resources.threads import TOOL_MODULES, is_tool_thread

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.budget import TeardownBudget

__all__ = ["TOOL_MODULES", "ShutdownGuard", "ShutdownLeakWarning", "is_tool_thread"]

#: Seconds the check waits first for new threads and processes no known owner explains to end
#: by themselves (a queue's feeder thread): each level of the owner search's backward walk it
#: spares is a pass over the whole heap (~10 ms with numpy loaded).
_BRIEF_S = 0.02

#: A test's allow_leaks, budget and markers' error, for a test without the markers.
_NO_MARKS: tuple[AllowLeaks | None, float | None, str | None] = (None, None, None)

#: After this many quiet gaps in a row (nothing new for any kind between a clean check and the
#: next set-up), a set-up starts from that check's readings without reading again (half of the
#: guard's cost on a clean test): only pytest's and its plugins' hooks run in a gap. Every
#: :data:`_PROBE_EVERY`-th set-up reads anyway; a gap that was not quiet, or a plugin
#: registered, makes every set-up read again until the gaps are quiet again.
_QUIET_GAPS_TRUSTED = 8
_PROBE_EVERY = 8


def _same(marks: list[Any], others: list[Any]) -> bool:
    """Two lists of fingerprints are equal; a value whose ``__eq__`` raises counts as moved."""
    try:
        return bool(marks == others)
    except Exception:  # noqa: BLE001 - a hostile __eq__ in process-wide state
        return False


@scanned_names_are_hooks
class ShutdownGuard(WhoseIsIt, GuardReports, SessionEnd):
    """The pytest plugin object registered when the guard is on (parts: guard.state)."""

    def pytest_plugin_registered(self) -> None:
        """A plugin registered during the run may act between tests: read the gaps again."""
        self._quiet_gaps = 0

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Validate the markers: a bad one is a usage error (exit code 4); on an xdist worker,
        where that would crash the worker, the test errors in setup instead. Last: markers a
        conftest adds count, and the tests ``-k`` or ``-m`` deselected are not asked."""
        on_worker = hasattr(self.config, "workerinput")
        for item in items:
            names = marker_names(item)
            if "allow_leaks" not in names and "shutdown_budget" not in names:
                continue
            marks: tuple[AllowLeaks | None, float | None, str | None]
            try:
                marks = (allow_leaks_of(item), budget_of(item, self.settings.budget_s), None)
            except pytest.UsageError as exc:
                if not on_worker:
                    raise
                marks = (None, None, str(exc))
            self._marked[id(item)] = marks

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
            marks=marks,
        )
        self._watch.gap_unread = gap_unread
        if not gap_unread:  # the set-up's readings may have found an earlier test's late leak
            self._report_late()
        origins.set_current_test(self._watch.nodeid)
        if marker_error is not None:  # the watch is set: its teardown finds what it expects
            pytest.fail(marker_error, pytrace=False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        """The teardown under the test's budget, then the check and the record."""
        __tracebackhide__ = True  # a fixture's teardown error shows the user's frames alone
        watch = self._watch
        if watch is None or watch.item is not item:
            return (yield)
        start = time.monotonic()
        budget = self._budget(watch) if watch.budget_s > 0 else None
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
        cut_short = None if error is None else self._teardown_error(watch, error)
        fired = budget.outcome if budget is not None and budget.outcome.fired else None
        guard_start = time.monotonic()
        guard_error = None
        try:  # (the test is still the current one while its check runs: see _note_late)
            findings = self._check(watch)
        except Exception as exc:  # noqa: BLE001 - the guard's own failure is not the test's
            findings, guard_error = [], describe_guard_error(exc)
        origins.set_current_test(None)
        findings = findings + quiet_findings(item)  # --shutdown-quiet's, when on
        guard_s = time.monotonic() - guard_start
        teardown_s = time.monotonic() - start  # the grace waited is part of the teardown
        if self._deferred is not None and self._deferred.due():  # earlier tests' verdicts
            self._deferred.confirm_due()
        # A test that already failed is one report: the findings go with its failure.
        reported = error is None and not watch.timed_out and not watch.failed
        if not findings and fired is None and guard_error is None and cut_short is None:
            self.report.add_clean(watch.nodeid, teardown_s, guard_s, reported)
        else:
            self._record(
                item, watch, findings, fired, guard_error, cut_short, teardown_s, guard_s, reported
            )
        if error is not None:
            raise error
        return result

    def _budget(self, watch: _Watch) -> TeardownBudget:
        from pytest_shutdown.plugin.budget import TeardownBudget  # noqa: PLC0415 - only with a budget

        return TeardownBudget(
            watch.budget_s, watch.nodeid, on_expire=lambda: self._kill_children(watch)
        )

    @staticmethod
    def _teardown_error(watch: _Watch, error: BaseException) -> str | None:
        """Note a pytest-timeout on ``watch``; return why the teardown was cut short, if it was."""
        if _is_pytest_timeout(error):
            watch.timed_out = True
        if isinstance(error, SystemExit):
            # pytest reports it as the test's teardown error, skips the finalizers still due
            # and goes on: the test is checked now, without a grace wait, and recorded.
            watch.failed = True
            return f"SystemExit({error.code!r}) in its teardown"
        return None

    def _snapshot_since(self, last: Snapshot, moved: set[str] | None) -> Snapshot:
        """``last``'s snapshot of each kind not in ``moved`` (None: all moved), fresh ones else."""
        with one_moment():
            return {
                kind.name: kind.snapshot()
                if moved is None or kind.name in moved
                else last[kind.name]
                for kind in self.kinds
            }

    def _moved(
        self, before: list[Any] | None, after: list[Any], baseline: Snapshot
    ) -> set[str] | None:
        """The kinds whose fingerprints moved (None: any may have)."""
        if before is None:
            return None
        moved = self._marks.moved(before, after)
        if moved is not None:
            for name, others in self._covered.items():
                if any(other in moved for other in others):
                    if not self._by_name[name].unmoved_since(baseline[name], moved):
                        moved.add(name)
        return moved

    def _check(self, watch: _Watch) -> list[Finding]:
        """The test's findings (in fail mode with order restored)."""
        before = watch.before
        marks = self._marks.read()  # before any kind's reading below: never the newer one
        if watch.marks is not None and _same(marks, watch.marks):
            self._clean = (marks, before)  # the common case: not one reading moved
            return []
        moved = self._moved(watch.marks, marks, before)
        if moved is not None and not moved and not watch.finished:
            # Only readings no kind answers by moved (a pid of a thread started and joined)
            self._clean = (marks, before)
            return []
        self._clean = None
        self._uncertain = set()
        allowed: set[str] = set()
        found = self._left_by_test(watch, marks, moved, allowed)
        if found is None:
            return []
        alive, grace, now = self._alive_after_grace(watch, found)
        findings = self._finished_findings(watch, alive)
        findings.extend(self._verdicts(watch, found, alive, allowed, moved, grace, now))
        return findings

    def _left_by_test(
        self, watch: _Watch, marks: list[Any], moved: set[str] | None, allowed: set[str]
    ) -> Found | None:
        """What the test left that is its own (None: nothing), around a brief wait for what is
        on its way out."""
        brief_s = min(_BRIEF_S, self.settings.grace_s) if self._waits_for(watch) else 0.0
        leaving: Found = {}
        left: Found | None = None
        with one_moment():
            asked = self._new_since(watch, moved)
            if brief_s > 0:
                leaving = self._leaving(asked)
            if not leaving:
                left = self._left(watch, allowed, moved, asked)
                if left is None:  # the next test starts from now (marks read before these)
                    self._clean = (marks, self._snapshot_since(watch.before, moved))
        if leaving:  # outside the moment: what they held is read afresh once they ended
            walked = self._let_go(leaving, brief_s)
            with one_moment():  # asked afresh: what ended took its pipes with it
                left = self._left(watch, allowed, moved, {}, walked)
        return left

    def _waits_for(self, watch: _Watch) -> bool:
        """Whether the test's own leftovers get their brief wait and grace here."""
        return not (watch.timed_out or watch.failed or self._deferred is not None)

    def _alive_after_grace(
        self, watch: _Watch, found: Found
    ) -> tuple[dict[str, set[Any]], float, float]:
        """What of ``found`` and of what fixtures torn down with the test started is alive after
        the grace; with the test's grace and the time the settling began."""
        fixtures: Found = {}
        for owned, _ in watch.finished:
            for name, items in owned.started.items():
                fixtures[name] = fixtures.get(name, ()) + items
        now = time.monotonic()
        deadline = now + self.settings.grace_s
        grace = 0.0 if watch.timed_out or watch.failed else self.settings.grace_s
        alive: dict[str, set[Any]] = {}
        if not self._waits_for(watch):
            # No grace for the test's own (its failure, or warn mode's deferred verdict);
            # fixtures torn down here still get theirs.
            for kind in self._objects:
                mine = kind.settle(found.get(kind.name, ()), now) if kind.name in found else ()
                theirs = kind.settle(fixtures.get(kind.name, ()), deadline) if fixtures else ()
                alive[kind.name] = set(mine) | set(theirs)
        else:  # one deadline for the test's own leftovers and those of fixtures torn down here
            for kind in self._objects:
                combined = found.get(kind.name, ()) + fixtures.get(kind.name, ())
                alive[kind.name] = set(kind.settle(combined, deadline)) if combined else set()
        return alive, grace, now

    def _verdicts(
        self,
        watch: _Watch,
        found: Found,
        alive: dict[str, set[Any]],
        allowed: set[str],
        moved: set[str] | None,
        grace: float,
        now: float,
    ) -> list[Finding]:
        """The test's findings of each kind its markers do not allow (warn mode: deferred);
        in fail mode, order restored for what is certainly the test's."""
        findings: list[Finding] = []
        restore: list[tuple[ResourceKind, tuple[Any, ...]]] = []
        for kind in self.kinds:
            if kind.name in allowed or (moved is not None and kind.name not in moved):
                continue
            if kind.stateful:
                items = tuple(kind.new_since(watch.before[kind.name]))
            else:
                items = tuple(i for i in found.get(kind.name, ()) if i in alive[kind.name])
            if items and self._deferred is not None and not kind.stateful and grace > 0:
                over = set(kind.already_over(items))
                if len(over) < len(items):
                    where = line_of(watch.item)
                    waiting = tuple(i for i in items if i not in over)
                    self._deferred.defer(watch.nodeid, watch.item.name, where, kind, waiting, now)
                if over:  # reported now (warn mode: nothing to restore)
                    ended = tuple(i for i in items if i in over)
                    findings.extend(self._test_findings(kind, ended, watch.item.name, grace)[0])
            elif items:
                found_now, certain = self._test_findings(kind, items, watch.item.name, grace)
                findings.extend(found_now)
                if certain:
                    restore.append((kind, certain))
        if self.settings.mode == "fail":  # warn mode changes nothing in the run
            for kind, items in restore:
                kind.restore(items)
        return findings

    def _test_findings(
        self, kind: ResourceKind, items: tuple[Any, ...], name: str, grace: float
    ) -> tuple[list[Finding], tuple[Any, ...]]:
        """A kind's findings, and the ``items`` certainly the test's (not cut-short searches)."""
        found_now = kind.findings(items, name, grace=grace)
        certain = tuple(i for i in items if (kind.name, i) not in self._uncertain)
        if len(certain) < len(items) and self.settings.mode == "fail":
            note = (
                f" {len(items) - len(certain)} of them not stopped: their owner search"
                " was cut short, so they may be a wider fixture's or a global's."
            )
            found_now = [
                Finding(f.code, f.message + note, {**f.details, "not_stopped": True})
                for f in found_now
            ]
        return found_now, certain
