"""Warn mode's deferred verdicts: candidate leaks confirmed while the next tests run.

Waiting out the grace before the next test made a real suite 1.48x slower under warn mode
(DESIGN.md §9, "Verdicts may wait; tests don't"). So what a test's check finds of an object kind
is a *candidate*, queued with its findings as they read when the test ended (a kind may describe
its items from that moment's readings only) and the end of its grace. Once the oldest deadline
has passed, after a later test's check, the items still there are confirmed with no wait: a
record for the test and a warning at its line; items that ended in time are dropped. At session
end the last candidates get :data:`ON_ITS_WAY_OUT_S` more and what is left is reported as still
running, how far into its grace. A deferred leak is in neither ``user_properties`` nor junitxml
(written before the grace runs out). Not deferred: a test that already failed, state kinds,
what fixtures torn down with the test left, and what a kind says no grace can change any more
(``already_over``: events that happened, such as a task a runner cancelled or a coroutine never
awaited): those are the test's findings at once.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.resources.base import after_grace

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.report import ShutdownReport
    from pytest_shutdown.resources.base import ResourceKind

__all__ = ["Candidate", "DeferredLeaks"]

#: Seconds the session end waits for the last candidates, at most: what is on its way out (a
#: process SIGKILLed by the last test, a thread told to stop) ends within it.
ON_ITS_WAY_OUT_S = 0.02


@dataclass
class Candidate:
    """One test's items of one kind: a leak unless they end before ``deadline``."""

    nodeid: str
    #: The subject of the findings (the test's name).
    subject: str
    #: Where the warning points: the test's file and line (1-based).
    where: tuple[str, int]
    kind: ResourceKind
    items: tuple[Any, ...]
    deadline: float
    #: The kind's findings for all ``items``, made when the test ended.
    findings: list[Finding]


class DeferredLeaks:
    """The queue of warn mode's candidates, in the order their tests ended (and so of their
    deadlines: one grace for all)."""

    def __init__(
        self, grace_s: float, report: ShutdownReport, render: Callable[[list[dict[str, Any]]], str]
    ) -> None:
        self.grace_s = grace_s
        self.report = report
        self.render = render
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
        now: float,
    ) -> None:
        """Queue a test's ``items`` of ``kind`` until the grace has run out."""
        findings = kind.findings(items, subject, grace=self.grace_s)
        self._queue.append(
            Candidate(nodeid, subject, where, kind, tuple(items), now + self.grace_s, findings)
        )
        # Never lost: a run killed before the verdict still names them, unconfirmed.
        self.report.add_pending(nodeid, [f.to_dict() for f in findings])

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
        """Session end: confirm what is due; what is still there of the others after at most
        :data:`ON_ITS_WAY_OUT_S` is reported as still running when the session ended. Returns
        the ``(kind name, item)`` pairs reported so (the sweep does not list them again)."""
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
        """Report what of ``batch`` is still there at ``deadline``; return those pairs."""
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
                made = self._findings(candidate, left)
                if session_end:
                    waited_s = deadline - (candidate.deadline - self.grace_s)
                    made = [_at_session_end(f, waited_s, self.grace_s) for f in made]
                by_test.setdefault(candidate.nodeid, []).extend(made)
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
        warn_at(text, candidate.where)


def warn_at(text: str, where: tuple[str, int]) -> None:
    """A :class:`ShutdownLeakWarning` attributed to ``where`` (a file and line)."""
    with warnings.catch_warnings():
        # Warn mode never fails a test: under -W error the warning is recorded, never raised.
        warnings.simplefilter("always", ShutdownLeakWarning)
        warnings.warn_explicit(ShutdownLeakWarning(text), ShutdownLeakWarning, *where)


def _at_session_end(finding: Finding, waited_s: float, grace_s: float) -> Finding:
    """``finding`` for an item still there at session end, ``waited_s`` into its grace."""
    waited = f"when the session ended, {waited_s:.2f} s into its {grace_s:g} s grace"
    grace = after_grace(grace_s)
    message = (
        finding.message.replace(grace, waited)
        if grace in finding.message
        else f"{finding.message} (found {waited})"
    )
    details = {**finding.details, "session_end": True, "waited_s": round(waited_s, 3)}
    return Finding(finding.code, message, details)
