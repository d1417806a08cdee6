"""A ``gc.freeze()`` left behind (``gc-frozen-leak``): a state kind over the freeze count."""

from __future__ import annotations

import gc
from collections.abc import Sequence

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import Change, Extra, StateKind
from pytest_shutdown.resources.primitives import Started, leak_findings

__all__ = ["FreezeKind"]


class FreezeKind(StateKind):
    """The freeze count. Only growth is a leak: frozen objects that die leave the permanent
    generation, so the count drifts down by itself while something else holds a freeze."""

    name = "gc-freeze"
    allow_key = "gc_freeze"
    mark = "freeze_count"

    def __init__(self) -> None:
        #: What was frozen before the session (CPython 3.12.1 starts at 375); 0 once an undo
        #: released it.
        self.at_start = gc.get_freeze_count()

    def _undo(self, before: int) -> None:
        """Undo a freeze that took the count above ``before``, when no more than what was frozen
        at the session's start was frozen before it. ``gc.unfreeze()`` is all or nothing:
        releasing the interpreter's own too is the only way (docs/limits.md). A count above
        ``at_start`` holds a wider-scope fixture's freeze: that is left alone, and so is the
        test's on top of it."""
        if before <= self.at_start and gc.get_freeze_count() > before:
            gc.unfreeze()
            self.at_start = 0

    def snapshot(self) -> int:
        return gc.get_freeze_count()

    def diff(self, before: int, after: int) -> list[Change]:
        if after > before:
            return [
                Change(
                    "gc.freeze_count",
                    before,
                    after,
                    undo=lambda: self._undo(before),
                )
            ]
        return []

    def absorb(self, before: int, start: int, end: int) -> int:
        return before + (end - start)

    def findings(
        self, items: Sequence[Change], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        found: list[Finding] = []
        for change in items:
            found.extend(
                leak_findings(
                    Started(),
                    grace=grace,
                    subject=subject,
                    freeze_before=change.before,
                    freeze_after=change.after,
                    extra=dict(extra or {}),
                )
            )
        return found
