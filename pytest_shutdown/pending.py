"""Warn mode's deferred verdicts: candidate leaks confirmed while the next tests run.

Why: the grace (``--shutdown-grace``, 2 s by default) is how long a test's threads, processes
and descriptors may take to end after its teardown. Waiting it out before the next test starts
costs a leaky suite the whole grace per leaking test, even in warn mode, which promises to change
nothing in the run (a real suite ran 1.48x slower under warn mode than under plain pytest,
nearly all of it grace waits). DESIGN.md §9, "Verdicts may wait; tests don't".

So in warn mode the guard does not wait at all, not even fail mode's brief wait (20 ms, for what
is on its way out: here it is dropped when its verdict comes). What a test's own check finds
of an object kind (threads, processes, descriptors, ports, segments ...) after its teardown is a
*candidate*: queued here with its test (node id, name, where
its warning points), its kind, its items, the findings as they read when the test ended (a kind
may describe its items from readings of that moment only), and a deadline, the end of its
grace. The next tests run at once. The queue is looked at after later tests' checks, cheaply:
only when something is queued and the oldest deadline has passed; then, with no wait, the
items still there are confirmed and reported against the test they belong to: a record for its
node id (merged into its record in the report, the JSON report and the terminal summary; on an
xdist worker it travels with the teardown report being made, or with the session's last
records), and a :class:`~pytest_shutdown.guard.ShutdownLeakWarning` that names the test,
attributed to the test's own line (pytest lists it under the test during which it was
confirmed). Items that ended in time are dropped: not a leak. At session end what is due is
confirmed; the rest (the last tests' candidates) get :data:`ON_ITS_WAY_OUT_S` more, and what is
still there then is reported as still running when the session ended, how far into its grace.
So warn mode's verdict on the last tests may name something that would have ended within its
grace, and that fail mode (which waits it out) does not report; it is a warning that says so,
never an outcome.

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

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import after_grace

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.report import ShutdownReport
    from pytest_shutdown.resources.base import ResourceKind

__all__ = ["Candidate", "DeferredLeaks"]

#: Seconds the session end waits for the last candidates still there, at most: what is on its
#: way out (a process SIGKILLed by the last test, a thread told to stop) ends within it.
ON_ITS_WAY_OUT_S = 0.02


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
        # Never lost: a run killed before the verdict still names them, unconfirmed.
        self.report.add_pending(nodeid, [f.to_dict() for f in self._queue[-1].findings])

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

    def confirm_all(self) -> set[tuple[str, Any]]:
        """Session end: confirm, with no wait, every candidate whose grace has run out; what is
        still there of the others after at most :data:`ON_ITS_WAY_OUT_S` (a process the last
        test just killed takes a few milliseconds to die) is reported as still running when the
        session ended (how far into its grace), not waited for any longer: warn mode costs a
        leaky suite no more than that at its end. Returns the ``(kind name, item)`` pairs
        reported so (the session-end sweep does not list them a second time)."""
        self.confirm_due()
        if not self._queue:
            return set()
        batch = list(self._queue)
        self._queue.clear()
        deadline = time.monotonic() + min(ON_ITS_WAY_OUT_S, self.grace_s)
        return self._confirm(batch, deadline, session_end=True)

    def _confirm(
        self, batch: list[Candidate], deadline: float, session_end: bool = False
    ) -> set[tuple[str, Any]]:
        """Report what of ``batch`` is still there at ``deadline`` (one settle per kind), one
        record and one warning per test; ``session_end``: their grace has not run out.
        Returns the ``(kind name, item)`` pairs reported."""
        reported: set[tuple[str, Any]] = set()
        if not batch:
            return reported
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
                reported.update((candidate.kind.name, i) for i in left)
                found = by_test.setdefault(candidate.nodeid, [])
                made = self._findings(candidate, left)
                if session_end:
                    waited_s = deadline - (candidate.deadline - self.grace_s)
                    made = [_at_session_end(f, waited_s, self.grace_s) for f in made]
                found.extend(made)
        decided: set[str] = set()
        for candidate in batch:
            findings = by_test.pop(candidate.nodeid, None)
            if findings:
                self._report(candidate, findings, session_end)
            if candidate.nodeid not in decided:
                decided.add(candidate.nodeid)
                self.report.add_decided(candidate.nodeid)
        return reported

    def _findings(self, candidate: Candidate, left: tuple[Any, ...]) -> list[Finding]:
        if len(left) == len(candidate.items):
            return candidate.findings
        try:  # some ended in time: describe the rest only
            return candidate.kind.findings(left, candidate.subject, grace=self.grace_s)
        except Exception:  # noqa: BLE001 - the findings made at the test's end stand
            return candidate.findings

    def _report(self, candidate: Candidate, findings: list[Finding], session_end: bool) -> None:
        plain = [f.to_dict() for f in findings]
        self.report.add_findings(candidate.nodeid, plain)
        when = (
            "still running when the session ended, before its grace ran out"
            if session_end
            else f"confirmed once its {self.grace_s:g} s grace ran out, while later tests ran"
        )
        text = f"{self.render(plain)}\n(leaked by {candidate.nodeid}: {when})"
        with warnings.catch_warnings():
            # Warn mode never fails a test: under -W error the warning is recorded, not raised.
            warnings.simplefilter("always", self.category)
            warnings.warn_explicit(
                self.category(text), self.category, candidate.path, candidate.lineno
            )


def _at_session_end(finding: Finding, waited_s: float, grace_s: float) -> Finding:
    """``finding`` as it reads for an item still there at session end, ``waited_s`` into its
    ``grace_s`` grace: the grace did not run out, and the message says so."""
    waited = f"when the session ended, {waited_s:.2f} s into its {grace_s:g} s grace"
    grace = after_grace(grace_s)
    message = (
        finding.message.replace(grace, waited)
        if grace in finding.message
        else f"{finding.message} (found {waited})"
    )
    details = {**finding.details, "session_end": True, "waited_s": round(waited_s, 3)}
    return Finding(finding.code, message, details)
