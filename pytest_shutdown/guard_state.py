"""The guard's state: what :class:`~pytest_shutdown.guard.ShutdownGuard` holds, made once per
session, and the few things every part of it uses (a snapshot of the kinds, the findings'
text, the test being watched).

``ShutdownGuard`` is one pytest plugin object (pluggy finds the hooks of every part on it),
assembled from parts a reader can hold one at a time, each a class of its own module over
:class:`GuardState`:

- :mod:`pytest_shutdown.guard`: the test's life, set-up, teardown, and the check after it;
- :mod:`pytest_shutdown.guard_ledger`: wider-scope fixtures own what their set-up started;
- :mod:`pytest_shutdown.guard_owners`: whose is it, of what a test left;
- :mod:`pytest_shutdown.guard_reports`: what pytest is told (reports, records, the error);
- :mod:`pytest_shutdown.guard_session_end`: late leaks, the long-lived list, the sweep, the exit.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown._os.moments import one_moment
from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.containment import Containment
from pytest_shutdown.pending import DeferredLeaks
from pytest_shutdown.report import ShutdownReport, render_findings
from pytest_shutdown.resources import default_kinds
from pytest_shutdown.resources.base import ResourceKind
from pytest_shutdown.resources.marks import FingerprintPass
from pytest_shutdown.resources.primitives import descendant_pids
from pytest_shutdown.settings import AllowLeaks, GuardSettings, shows_details

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.guard_ledger import _Owned

#: kind name -> a snapshot of that kind
Snapshot = dict[str, Any]
#: kind name -> the items of that kind (objects, or Change records of a state kind)
Found = dict[str, tuple[Any, ...]]


class _Watch:
    """The guard's state for the test being run. ``before`` is each kind's baseline, with what
    wider-scope fixtures did during the test's set-up and teardown absorbed into it. (A plain
    class: one is made per test, and a dataclass's generated methods cost 0.5 ms to make.)"""

    __slots__ = ("item", "before", "marks", "allow", "budget_s", "finished", "timed_out",
                 "failed", "gap_unread", "nodeid")

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


def _fingerprinted_by_others(kind: ResourceKind, on: Mapping[str, ResourceKind]) -> bool:
    """Whether the kinds ``kind`` names in ``fingerprinted_by`` are all on (their fingerprints
    then move whenever its own would)."""
    others = kind.fingerprinted_by
    return bool(others) and all(name in on for name in others)


class GuardState:
    """The state of the guard, shared by its parts, and how it is made (once per session)."""

    #: Warn mode: a test's candidate leaks, confirmed once their grace ran out while the next
    #: tests run (:mod:`pytest_shutdown.pending`); fail mode waits the grace (None).
    _deferred: DeferredLeaks | None
    #: node id -> the kinds its markers allow anything (``allow_leaks(processes=True)``): what
    #: is found of them after the test is allowed too.
    _allowed_late: dict[str, set[str]]

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
            if kind.finds_late:  # the guard keeps the current test: late items are told apart
                kind.track_late = True
        self._states = [k for k in self.kinds if k.stateful]
        self._by_name = {k.name: k for k in self.kinds}
        #: The kinds whose fingerprints the fast path compares: not one whose fingerprint is
        #: made of readings other kinds on this run compare already.
        self._marks = FingerprintPass(
            [k for k in self.kinds if not _fingerprinted_by_others(k, self._by_name)]
        )
        #: kind -> the kinds whose fingerprints stand for its own (the ports kind's)
        self._covered = {
            k.name: tuple(k.fingerprinted_by)
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
        #: Each live wider-scope fixture's ledger (:mod:`pytest_shutdown.guard_ledger`).
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
        self._deferred = (
            DeferredLeaks(settings.grace_s, report, self._render, ShutdownLeakWarning)
            if settings.mode == "warn"
            else None
        )

    @staticmethod
    def _snapshot(kinds: list[ResourceKind]) -> Snapshot:
        with one_moment():  # the kinds share their readings (descendants, fd count ...)
            return {kind.name: kind.snapshot() for kind in kinds}

    def _render(self, plain: list[Any]) -> str:
        return render_findings(plain, details=shows_details(self.config))
