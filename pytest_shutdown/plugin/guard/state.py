"""The guard's state, made once per session, and what every part of the guard uses.

``ShutdownGuard`` is one pytest plugin object assembled from parts, each a class over
:class:`GuardState` in a module of its own in this folder: the package itself (the test's life
and its check), ``ledger`` (wider-scope fixtures), ``owners`` (whose is it), ``reports`` (what
pytest is told) and ``session_end`` (late leaks, the long-lived list, the sweep, the exit).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown._fast.marks import FingerprintPass
from pytest_shutdown._fast.moments import one_moment
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.containment import Containment
from pytest_shutdown.plugin.pending import DeferredLeaks
from pytest_shutdown.plugin.report import ShutdownReport, render_findings
from pytest_shutdown.plugin.settings import AllowLeaks, GuardSettings, shows_details
from pytest_shutdown.resources import default_kinds
from pytest_shutdown.resources.base import ResourceKind
from pytest_shutdown.resources.primitives import descendant_pids

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.guard.ledger import _Owned

#: kind name -> a snapshot of that kind
Snapshot = dict[str, Any]
#: kind name -> the items of that kind (objects, or Change records of a state kind)
Found = dict[str, tuple[Any, ...]]


class _Watch:
    """The test being run; ``before`` absorbs what wider-scope fixtures did meanwhile. (Not a
    dataclass: one is made per test, and a dataclass's generated methods cost 0.5 ms.)"""

    __slots__ = (
        "item",
        "before",
        "marks",
        "allow",
        "budget_s",
        "finished",
        "timed_out",
        "failed",
        "gap_unread",
        "nodeid",
    )

    def __init__(
        self,
        item: pytest.Item,
        before: Snapshot,
        allow: AllowLeaks | None,
        budget_s: float,
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
        #: ``before`` is the last clean check's, the gap since then not read (_QUIET_GAPS_TRUSTED)
        self.gap_unread = False


def line_of(item: pytest.Item) -> tuple[str, int]:
    """The test's file and line (1-based), where its warnings point."""
    path, lineno, _ = item.reportinfo()
    return str(path), (lineno or 0) + 1


def _fingerprinted_by_others(kind: ResourceKind, on: Mapping[str, ResourceKind]) -> bool:
    """Whether the kinds in ``kind.fingerprinted_by`` are all on (theirs move with its own)."""
    others = kind.fingerprinted_by
    return bool(others) and all(name in on for name in others)


class GuardState:
    """The state of the guard, shared by its parts."""

    def __init__(
        self, config: pytest.Config, settings: GuardSettings, report: ShutdownReport
    ) -> None:
        self.config = config
        self.settings = settings
        self.report = report
        #: In the order their findings are listed.
        self.kinds: list[ResourceKind] = default_kinds(settings.resources, settings=settings)
        self._objects = [k for k in self.kinds if not k.stateful]
        #: node id -> the kinds its markers allow anything: what is found of them late is allowed.
        self._allowed_late: dict[str, set[str]] = {}
        #: ``(kind, item)`` whose owner search in this check was cut short: reported, never stopped.
        self._uncertain: set[tuple[str, Any]] = set()
        for kind in self._objects:
            if kind.finds_late:  # the guard keeps the current test: late items are told apart
                kind.track_late = True
        self._states = [k for k in self.kinds if k.stateful]
        self._by_name = {k.name: k for k in self.kinds}
        #: kind -> the kinds whose fingerprints stand for its own (the ports kind's)
        self._covered = {
            k.name: tuple(k.fingerprinted_by)
            for k in self.kinds
            if _fingerprinted_by_others(k, self._by_name)
        }
        #: The fast path compares no kind whose fingerprint other kinds on this run compare.
        self._marks = FingerprintPass([k for k in self.kinds if k.name not in self._covered])
        self._watch: _Watch | None = None
        #: id(item) -> its allow_leaks, budget and markers' error (items live the whole session)
        self._marked: dict[int, tuple[AllowLeaks | None, float | None, str | None]] = {}
        #: The xdist worker's id, else None.
        self._worker = self.report.worker
        #: The last clean test's fingerprints and baseline, for the next test's set-up.
        self._clean: tuple[list[Any], Snapshot] | None = None
        #: See _QUIET_GAPS_TRUSTED.
        self._quiet_gaps = 0
        self._setups = 0
        #: fixturedef -> its ledger, while it is live (:mod:`pytest_shutdown.plugin.guard.ledger`).
        self._owned: dict[Any, _Owned] = {}
        #: (kind, item) owned by a module global or class attribute -> what the report says.
        self._long_lived: dict[Any, dict[str, Any]] = {}
        #: Failed setup/call reports by node id, to attach the teardown's findings to.
        self._failed_reports: dict[str, pytest.TestReport] = {}
        origins.install()
        #: Nothing a test starts hides by being re-parented (environment marker, subreaper).
        self.containment = Containment().engage(subreaper=settings.containment == "subreaper")
        with one_moment():  # opens the readings' handles now, not inside the first test
            for kind in self.kinds:
                kind.fingerprint()
        #: Never swept at session end.
        self._session_start_pids = descendant_pids()
        self._session_start_threads = set(threading.enumerate())
        #: Non-daemon threads tests left, alive at session end.
        self._blocking_exit: list[threading.Thread] = []
        #: Warn mode's deferred verdicts (:mod:`pytest_shutdown.plugin.pending`); None in fail mode.
        self._deferred: DeferredLeaks | None = None
        if settings.mode == "warn":
            self._deferred = DeferredLeaks(settings.grace_s, report, self._render)

    @staticmethod
    def _snapshot(kinds: list[ResourceKind]) -> Snapshot:
        with one_moment():  # the kinds share their readings (descendants, fd count ...)
            return {kind.name: kind.snapshot() for kind in kinds}

    def _render(self, plain: list[Any]) -> str:
        return render_findings(plain, details=shows_details(self.config))
