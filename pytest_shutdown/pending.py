"""Warn mode's deferred verdicts: candidate leaks confirmed while the next tests run.

Why: the grace (``--shutdown-grace``, 2 s by default) is how long a test's threads, processes
and descriptors may take to end after its teardown. Waiting it out before the next test starts
costs a leaky suite the whole grace per leaking test, even in warn mode, which promises to change
nothing in the run (a real suite ran 1.48x slower under warn mode than under plain pytest,
nearly all of it grace waits). DESIGN.md §9, "Verdicts may wait; tests don't".

So in warn mode the guard waits only its brief wait (a few milliseconds, for what is on its way
out). What a test's own check still finds of an object kind (threads, processes, descriptors,
ports, segments ...) after it is a *candidate*: queued here with its test (node id, name, where
its warning points), its kind, its items, the findings as they read when the test ended (a kind
may describe its items from readings of that moment only), and a deadline, the end of its
grace. The next tests run at once. The queue is looked at after later tests' checks, cheaply:
only when something is queued and the oldest deadline has passed; then, with no wait, the
items still there are confirmed and reported against the test they belong to: a record for its
node id (merged into its record in the report, the JSON report and the terminal summary; on an
xdist worker it travels with the teardown report being made, or with the session's last
records), and a :class:`~pytest_shutdown.guard.ShutdownLeakWarning` that names the test,
attributed to the test's own line (pytest lists it under the test during which it was
confirmed). Items that ended in time are dropped: not a leak. At session end the guard waits at
most until the latest deadline (never more than the grace; not at all once interrupted) and
confirms the rest.

What cannot follow a deferred verdict: the test's ``user_properties`` (its reports, and the
junitxml properties made from them, are written before the grace runs out); a deferred leak
is in neither. Fail mode keeps its synchronous grace: it errors the leaking test itself and
restores order before the next one. A test that already failed, state kinds (nothing ends by
waiting) and what a wider-scope fixture torn down with the test left behind are decided as
before, at the test's own teardown.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_shutdown.findings import Finding

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.report import ShutdownReport
    from pytest_shutdown.resources.base import ResourceKind

__all__ = ["Candidate", "DeferredLeaks"]


@dataclass
class Candidate:
    """One test's items of one kind still there after the brief wait: a leak unless they end
    before ``deadline``."""

    nodeid: str
    #: The subject of the findings (the test's name).
    subject: str
    #: Where the warning points: the test's file and line (1-based).
    path: str
    lineno: int
    kind: ResourceKind
    items: tuple[Any, ...]
    deadline: float
    #: The kind's findings for all ``items``, made when the test ended.
    findings: list[Finding]


class DeferredLeaks:
    """The queue of warn mode's candidates, in the order their tests ended (and so of their
    deadlines: one grace for all)."""

    def __init__(
        self,
        grace_s: float,
        report: ShutdownReport,
        render: Callable[[list[dict[str, Any]]], str],
        category: type[Warning],
    ) -> None:
        self.grace_s = grace_s
        self.report = report
        self.render = render
        self.category = category
        self._queue: deque[Candidate] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def defer(
        self,
        nodeid: str,
        subject: str,
        where: tuple[str, int],
        kind: ResourceKind,
        items: Sequence[Any],
        now: float | None = None,
    ) -> None:
        """Queue a test's ``items`` of ``kind`` (alive after the brief wait) until the grace
        has run out."""
        start = time.monotonic() if now is None else now
        self._queue.append(
            Candidate(
                nodeid,
                subject,
                where[0],
                where[1],
                kind,
                tuple(items),
                start + self.grace_s,
                kind.findings(items, subject, grace=self.grace_s),
            )
        )

    def due(self) -> bool:
        """Whether the oldest candidate's grace has run out (cheap: one clock read)."""
        return bool(self._queue) and time.monotonic() >= self._queue[0].deadline

    def confirm_due(self) -> None:
        """Confirm, with no wait, every candidate whose grace has run out."""
        now = time.monotonic()
        due: list[Candidate] = []
        while self._queue and self._queue[0].deadline <= now:
            due.append(self._queue.popleft())
        self._confirm(due, now)

    def confirm_all(self, wait: bool = True) -> None:
        """Session end: confirm every candidate, each when its grace has run out (waiting at
        most until the latest deadline, never more than the grace); ``wait=False``: now."""
        now = time.monotonic()
        bound = now + self.grace_s if wait else now
        while self._queue:
            deadline = min(self._queue[0].deadline, bound)
            batch: list[Candidate] = []
            while self._queue and min(self._queue[0].deadline, bound) <= deadline:
                batch.append(self._queue.popleft())
            self._confirm(batch, deadline)

    def _confirm(self, batch: list[Candidate], deadline: float) -> None:
        """Report what of ``batch`` is still there at ``deadline`` (one settle per kind), one
        record and one warning per test."""
        if not batch:
            return
        by_kind: dict[int, list[Candidate]] = {}
        for candidate in batch:
            by_kind.setdefault(id(candidate.kind), []).append(candidate)
        alive: set[tuple[int, Any]] = set()
        for candidates in by_kind.values():
            kind = candidates[0].kind
            items = tuple(i for c in candidates for i in c.items)
            try:
                left = kind.settle(items, deadline)
            except Exception:  # noqa: BLE001 - the guard's own failure: report them as found
                left = items
            alive.update((id(kind), i) for i in left)
        by_test: dict[str, list[Finding]] = {}
        for candidate in batch:  # in the order the tests ended, each test's kinds in order
            left = tuple(i for i in candidate.items if (id(candidate.kind), i) in alive)
            if left:
                found = by_test.setdefault(candidate.nodeid, [])
                found.extend(self._findings(candidate, left))
        for candidate in batch:
            findings = by_test.pop(candidate.nodeid, None)
            if findings:
                self._report(candidate, findings)

    def _findings(self, candidate: Candidate, left: tuple[Any, ...]) -> list[Finding]:
        if len(left) == len(candidate.items):
            return candidate.findings
        try:  # some ended in time: describe the rest only
            return candidate.kind.findings(left, candidate.subject, grace=self.grace_s)
        except Exception:  # noqa: BLE001 - the findings made at the test's end stand
            return candidate.findings

    def _report(self, candidate: Candidate, findings: list[Finding]) -> None:
        plain = [f.to_dict() for f in findings]
        self.report.add_findings(candidate.nodeid, plain)
        text = (
            f"{self.render(plain)}\n(leaked by {candidate.nodeid}: confirmed once its "
            f"{self.grace_s:g} s grace ran out, while later tests ran)"
        )
        with warnings.catch_warnings():
            # Warn mode never fails a test: under -W error the warning is recorded, not raised.
            warnings.simplefilter("always", self.category)
            warnings.warn_explicit(
                self.category(text), self.category, candidate.path, candidate.lineno
            )
