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
    generation, so the count drifts down by itself while something else holds a freeze.

    The count is not zero at every start (CPython 3.12.1 starts at 375): the kind reads it
    when the guard is built (``pytest_configure``) as ``at_start``, and the undo in fail mode
    (:meth:`_undo`) compares the count before the test with it, not with zero.
    """

    name = "gc-freeze"
    allow_key = "gc_freeze"
    mark = "freeze_count"  # the guard's one-pass reading (resources.marks)

    def __init__(self) -> None:
        #: What was frozen before the session (the interpreter's own, or a pre-session freeze);
        #: 0 once an undo has released it.
        self.at_start = gc.get_freeze_count()

    def _undo(self, before: int) -> None:
        """Undo a freeze that took the count above ``before``, when only the session's own was
        frozen before it.

        ``gc.unfreeze()`` is all or nothing: it puts every frozen object back into the oldest
        generation, and nothing can freeze some objects and not others. So a freeze is undone
        only when what was frozen before it is no more than what was frozen when the session
        started (``before <= at_start``): nothing at all (``before == 0``), or the interpreter's
        own (CPython 3.12.1 starts with 375 of its static types' base and MRO tuples frozen), or
        a freeze made before the plugin was configured (a conftest at import). Releasing those
        too is the only way to undo the test's freeze (docs/limits.md says so); after it nothing
        from before the session is frozen, and ``at_start`` is 0. A count above ``at_start``
        before the freeze holds a freeze made during the session (a wider-scope fixture's, still
        in its scope): that is left alone, and so is the test's freeze on top of it.
        """
        if before <= self.at_start and gc.get_freeze_count() > before:
            gc.unfreeze()
            self.at_start = 0

    def snapshot(self) -> int:
        return gc.get_freeze_count()

    fingerprint = snapshot  # compared as it is

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

    def rebase(self, before: int, start: int, end: int) -> int:
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
