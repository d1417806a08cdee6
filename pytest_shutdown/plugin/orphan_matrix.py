"""``@pytest.mark.orphan_matrix``: every level of a process tree, every signal, every phase.

``orphan_matrix(level=[...], signal=[...], phase=[...])`` parametrizes the ``orphan_cell``
fixture, ids like ``worker-SIGKILL-busy``; the ``kill_tree`` fixture runs one cell
(:func:`pytest_shutdown.helpers.orphans.assert_tree_dies` through the session's
``tree_launcher``). Levels and phases are the target's (``DISTRIBUTED_LEVELS``: ``rank0``...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._fast.node_markers import ORPHAN_MATRIX

# helpers.orphans (the tree launcher, multiprocessing.connection, ctypes) is imported only
# where a matrix is built or run: every session loads the plugin.
if TYPE_CHECKING:
    from pytest_shutdown.helpers.orphans import TreeDeath
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher

MARKER = ORPHAN_MATRIX
ACCEPTED_KEYS = ("level", "signal", "phase")
DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "level": ("root",),
    "signal": ("SIGKILL",),
    "phase": ("ready",),
}


@lazy_dataclass(frozen=True)
class OrphanCell:
    """One cell of an orphan matrix: which level gets which signal in which phase."""

    level: str
    signal: str
    phase: str

    @property
    def id(self) -> str:
        return f"{self.level}-{self.signal}-{self.phase}"


def cells_from_marker(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[OrphanCell]:
    """Validate the marker's arguments and build its cells; ``ValueError`` names what is wrong."""
    if args:
        raise ValueError(f"{MARKER}: takes keyword arguments only; accepted: "
                         f"{', '.join(ACCEPTED_KEYS)}")
    unknown = sorted(set(kwargs) - set(ACCEPTED_KEYS))
    if unknown:
        raise ValueError(f"{MARKER}: unknown argument(s) {', '.join(unknown)}; accepted: "
                         f"{', '.join(ACCEPTED_KEYS)}")
    from pytest_shutdown.helpers.orphans import parse_signal, signal_name  # noqa: PLC0415

    axes = {key: _names(key, kwargs.get(key, DEFAULTS[key])) for key in ACCEPTED_KEYS}
    try:
        signals = [signal_name(parse_signal(s)) for s in axes["signal"]]
    except ValueError as exc:
        raise ValueError(f"{MARKER}: {exc}") from None
    return [
        OrphanCell(level, sig, phase)
        for level in axes["level"]
        for sig in signals
        for phase in axes["phase"]
    ]


def _names(key: str, value: Any) -> list[Any]:
    values = [value] if isinstance(value, (str, int)) else list(value)
    if not values:
        raise ValueError(f"{MARKER}: {key}= is empty; give at least one value")
    for item in values:
        ok = isinstance(item, str) and item.strip() or (key == "signal" and isinstance(item, int))
        if not ok:
            raise ValueError(f"{MARKER}: {key}= expects names, got {item!r}")
        if isinstance(item, str) and (item != item.strip() or "\n" in item):
            raise ValueError(
                f"{MARKER}: {key}= {item!r} can never match: a name is one line without "
                "surrounding spaces"
            )
    return values


KillTree = Callable[..., "TreeDeath"]


def kill_tree_of(request: pytest.FixtureRequest, tree_launcher: TreeLauncher) -> KillTree:
    """The value of the ``kill_tree`` fixture (:mod:`pytest_shutdown.plugin.fixtures`) for one
    test."""
    callspec = getattr(request.node, "callspec", None)
    cell = callspec.params.get("orphan_cell") if callspec is not None else None

    def kill(target: Callable[..., Any] | Sequence[str], **options: Any) -> TreeDeath:
        __tracebackhide__ = True
        if isinstance(cell, OrphanCell):
            for key in ACCEPTED_KEYS:
                options.setdefault(key, getattr(cell, key))
        options.setdefault("launcher", tree_launcher)
        from pytest_shutdown.helpers.orphans import assert_tree_dies  # noqa: PLC0415

        return assert_tree_dies(target, **options)

    return kill
