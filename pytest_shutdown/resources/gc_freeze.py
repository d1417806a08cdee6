"""A ``gc.freeze()`` left behind (``gc-frozen-leak``): a state kind over the freeze count."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.checks.leaks import Started, leak_findings
from pytest_shutdown.findings import Finding
from pytest_shutdown.resources.base import Change, StateKind

__all__ = ["FreezeKind"]


def _unfreeze_if_none_before(before: int) -> None:
    # Only growth from zero can be undone safely: a freeze that was there before is someone's.
    if before == 0 and gc.get_freeze_count() > 0:
        gc.unfreeze()


class FreezeKind(StateKind):
    """The freeze count. Only growth is a leak: frozen objects that die leave the permanent
    generation, so the count drifts down by itself while something else holds a freeze."""

    name = "gc-freeze"
    allow_key = "gc_freeze"
    mark = "freeze_count"  # the guard's one-pass reading (resources.marks)

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
                    undo=lambda: _unfreeze_if_none_before(before),
                )
            ]
        return []

    def rebase(self, before: int, start: int, end: int) -> int:
        return before + (end - start)

    def findings(
        self,
        items: Sequence[Change],
        subject: str,
        *,
        grace: float,
        extra: Mapping[str, Any] | None = None,
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
