"""What pytest reads of the plugin's objects: the names of a node's markers, kept per node on
top of its parent's (collection, the guard and the cycles hook all ask), and the names a
registered plugin object or plugin module shows (:func:`scanned_names_are_hooks`,
:func:`scanned_module_names`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pytest

__all__ = [
    "CYCLES",
    "CYCLES_HELP",
    "ORPHAN_MATRIX",
    "SHUTDOWN_MATRIX",
    "marker_names",
    "scanned_module_names",
    "scanned_names_are_hooks",
]

_Plugin = TypeVar("_Plugin", bound=type)

#: The matrices' markers, named here so that the fixtures need not import their modules.
SHUTDOWN_MATRIX = "shutdown_matrix"
ORPHAN_MATRIX = "orphan_matrix"
#: The growth marker (:mod:`pytest_shutdown.plugin.cycles`, imported only where a test uses it).
CYCLES = "shutdown_cycles"
CYCLES_HELP = (
    "shutdown_cycles(n, warmup=2): run this test's call phase warmup + n times in one process "
    "(fixtures set up once) and fail it with 'growth' when objects, threads, fds or memory grow "
    "from call to call."
)

#: A node's marker names, with the count of its own markers and its parent's names (the very
#: object) they were computed from, so that a marker added since is seen.
_MARKER_NAMES_KEY = pytest.StashKey[tuple[int, frozenset[str], frozenset[str]]]()
_NO_NAMES: frozenset[str] = frozenset()
#: One frozenset per distinct set of names: an object kept per test is walked by every full
#: collection until the process ends.
_SHARED_NAMES: dict[frozenset[str], frozenset[str]] = {_NO_NAMES: _NO_NAMES}
_SHARED_LIMIT = 4096


def marker_names(node: Any) -> frozenset[str]:
    """The names of every marker on ``node`` and its parents (``node.iter_markers()``), kept
    per node on top of its parent's: one look at its own markers, not a walk up the tree."""
    parent = node.parent
    inherited = marker_names(parent) if parent is not None else _NO_NAMES
    own = node.own_markers
    kept = node.stash.get(_MARKER_NAMES_KEY, None)
    if kept is not None and kept[0] == len(own) and kept[1] is inherited:
        return kept[2]
    names = inherited.union([mark.name for mark in own]) if own else inherited
    if len(_SHARED_NAMES) < _SHARED_LIMIT:
        names = _SHARED_NAMES.setdefault(names, names)
    node.stash[_MARKER_NAMES_KEY] = (len(own), inherited, names)
    return names


def scanned_names_are_hooks(cls: _Plugin) -> _Plugin:
    """``dir()`` of an instance of ``cls`` lists its hook methods only (the ``pytest_*`` names).

    pluggy (for hooks) and pytest's fixture manager read every name ``dir()`` lists: the
    guard's and the report's hundred-odd names cost every guarded session some 2 ms. Neither
    defines a fixture; the attributes themselves are untouched.
    """

    def __dir__(self: object) -> list[str]:  # a subclass's hooks and an instance's too
        return [name for name in object.__dir__(self) if name.startswith("pytest_")]

    cls.__dir__ = __dir__  # type: ignore[assignment,method-assign]
    return cls


def scanned_module_names(namespace: Mapping[str, Any]) -> Callable[[], list[str]]:
    """A plugin module's ``__dir__`` (PEP 562): its hooks (``pytest_*``) and fixtures only.

    pytest reads every name ``dir()`` lists of a plugin module twice (hooks, fixtures): the
    fixtures module's other names cost every session some 2.5 ms. Call it at the end of the
    module, with its ``globals()``; the attributes themselves are untouched.
    """
    from _pytest.fixtures import getfixturemarker  # noqa: PLC0415 - what pytest itself asks

    names = [
        name
        for name, value in namespace.items()
        if (name.startswith("pytest_") and callable(value)) or getfixturemarker(value) is not None
    ]

    def __dir__() -> list[str]:
        return list(names)

    return __dir__
