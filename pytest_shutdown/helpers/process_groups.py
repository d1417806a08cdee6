"""``process-group-left``: a ``torch.distributed`` process group still initialised.

A default process group (``init_process_group``) or a group made with ``new_group`` that is
never destroyed keeps its communicators, its store connection and its threads until the
interpreter exits; the next ``init_process_group`` in the same process fails ("trying to
initialize the default process group twice"), and with nccl the exit itself can hang (vLLM
#19196). ``process_groups()`` lists the groups initialised in this process;
``assert_process_group_destroyed()`` fails when any is (or when the given ones are);
the guard reports the groups a test left that were not there before it.

Never imports torch: when ``torch.distributed`` was never imported, no group can exist.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from pytest_shutdown._base.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.finding import Finding, raise_if_any


@lazy_dataclass(frozen=True)
class GroupInfo:
    """One initialised process group of this process."""

    name: str
    backend: str
    ranks: tuple[int, ...]
    default: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "ranks": list(self.ranks),
                "default": self.default}


def process_groups() -> list[GroupInfo]:
    """The process groups initialised in this process (empty without ``torch.distributed``)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
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
        found.append(GroupInfo(
            name=str(getattr(world, "pg_names", {}).get(pg, "")),
            backend=str(backend),
            ranks=tuple(sorted(int(r) for r in ranks)),
            default=pg is default,
        ))
    return found


def group_names() -> frozenset[str]:
    """The names of the initialised groups: cheap, for a snapshot before a test."""
    return frozenset(g.name for g in process_groups())


def process_group_findings(subject: str, before: Iterable[str] = ()) -> list[Finding]:
    """``process-group-left`` for every group initialised now that was not in ``before``."""
    old = set(before)
    left = [g for g in process_groups() if g.name not in old]
    return [
        Finding(
            "process-group-left",
            f"{'the default process group' if g.default else 'process group'} {g.name!r} "
            f"({g.backend}, ranks {list(g.ranks)}) is still initialised after {subject}; "
            "call torch.distributed.destroy_process_group() (or abort it when a peer is gone)",
            {"subject": subject, **g.to_dict()},
        )
        for g in left
    ]


def assert_process_group_destroyed(subject: str = "the shutdown") -> None:
    """Fail with ``process-group-left`` when any process group of this process is initialised.

    Use it after an engine's (or a test's) shutdown: the default group and every group made
    with ``new_group`` must be destroyed (or aborted) by then.
    """
    __tracebackhide__ = True
    raise_if_any(process_group_findings(subject))
