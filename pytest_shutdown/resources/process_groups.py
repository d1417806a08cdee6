"""The ``process-groups`` resource kind: a ``torch.distributed`` process group still initialised.

A group never destroyed keeps its communicators, store connection and threads until exit; the
next ``init_process_group`` fails, and with nccl the exit can hang (vLLM #19196). The state is
the names of the initialised groups; one left that was not there before is
``process-group-left``. Never imports torch: without ``torch.distributed`` the reading is one
``sys.modules`` lookup. Nothing is restored (the group's peers may be gone).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import Change, Extra, StateKind

__all__ = [
    "C10D",
    "NO_GROUPS",
    "GroupInfo",
    "ProcessGroupKind",
    "group_names",
    "process_group_findings",
    "process_groups",
]

#: The module that holds the process groups: none exist before it is imported.
C10D = "torch.distributed.distributed_c10d"
#: The kind's state while ``torch.distributed`` is not loaded.
NO_GROUPS: frozenset[str] = frozenset()


@lazy_dataclass(frozen=True)
class GroupInfo:
    """One initialised process group of this process."""

    name: str
    backend: str
    ranks: tuple[int, ...]
    default: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "ranks": list(self.ranks),
            "default": self.default,
        }


def process_groups() -> list[GroupInfo]:
    """The process groups initialised in this process (empty without ``torch.distributed``)."""
    c10d = sys.modules.get(C10D)
    if c10d is None:
        return []
    world = getattr(c10d, "_world", None)
    if world is None:
        return []
    default = getattr(world, "default_pg", None)
    found = []
    for pg, value in list(getattr(world, "pg_map", {}).items()):
        backend = value[0] if isinstance(value, tuple) and value else value
        ranks = getattr(world, "pg_group_ranks", {}).get(pg, {})
        found.append(
            GroupInfo(
                name=str(getattr(world, "pg_names", {}).get(pg, "")),
                backend=str(backend),
                ranks=tuple(sorted(int(r) for r in ranks)),
                default=pg is default,
            )
        )
    return found


def group_names() -> frozenset[str]:
    """The names of the initialised groups: cheap, for a snapshot before a test."""
    if C10D not in sys.modules:
        return NO_GROUPS
    return frozenset(g.name for g in process_groups())


def _finding(group: GroupInfo, subject: str, extra: Extra = None) -> Finding:
    return Finding(
        "process-group-left",
        f"{'the default process group' if group.default else 'process group'} {group.name!r} "
        f"({group.backend}, ranks {list(group.ranks)}) is still initialised after {subject}; "
        "call torch.distributed.destroy_process_group() (or abort it when a peer is gone)",
        {"subject": subject, **group.to_dict(), **(extra or {})},
    )


def process_group_findings(subject: str, before: Iterable[str] = ()) -> list[Finding]:
    """``process-group-left`` for every group initialised now that was not in ``before``."""
    old = set(before)
    return [_finding(g, subject) for g in process_groups() if g.name not in old]


class ProcessGroupKind(StateKind):
    """The ``process-groups`` kind (see the module docstring): its state is the names of the
    initialised groups; a change is a group initialised since (``key``: its name)."""

    name = "process-groups"
    allow_key = "process_groups"
    mark = "c10d"
    mark_reading = staticmethod(group_names)  # one lookup while torch.distributed is not loaded

    def snapshot(self) -> frozenset[str]:
        return group_names()

    def diff(self, before: frozenset[str], after: frozenset[str]) -> list[Change]:
        return [Change(name, None, name) for name in sorted(after - before)]

    def absorb(
        self, before: frozenset[str], start: frozenset[str], end: frozenset[str]
    ) -> frozenset[str]:
        """What a wider-scope fixture initialised (or destroyed) is part of the baseline."""
        return (before | (end - start)) - (start - end)

    def findings(
        self, items: Sequence[Change], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        """One ``process-group-left`` per group still initialised, in torch's order."""
        left = {change.key for change in items}
        where = subject if subject.startswith("fixture ") else f"test {subject}"
        return [_finding(g, where, extra) for g in process_groups() if g.name in left]
