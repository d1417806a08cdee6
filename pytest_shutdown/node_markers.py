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

#: The timeout matrix's marker (:mod:`pytest_shutdown.matrix`) and the orphan matrix's
#: (:mod:`pytest_shutdown.orphan_matrix`), named here so that the fixtures module can check for
#: them without importing either.
SHUTDOWN_MATRIX = "shutdown_matrix"
ORPHAN_MATRIX = "orphan_matrix"
#: The growth marker (:mod:`pytest_shutdown.cycles`): named here so that loading the plugin and
#: validating markers import that module only for a session whose tests use it.
CYCLES = "shutdown_cycles"
CYCLES_HELP = (
    "shutdown_cycles(n, warmup=2): run this test's call phase warmup + n times in one process "
    "(fixtures set up once) and fail it with 'growth' when objects, threads, fds or memory grow "
    "from call to call."
)

#: A node's marker names, with what they were computed from: the count of its own markers and
#: its parent's names (the very object), so that a marker added since (``add_marker``, a
#: module's ``pytestmark`` read after a first question) is seen.
_MARKER_NAMES_KEY = pytest.StashKey[tuple[int, frozenset[str], frozenset[str]]]()
_NO_NAMES: frozenset[str] = frozenset()
#: One frozenset per distinct set of names: a session's tests share a handful of them, and each
#: object kept per test is freed (and walked by every full collection) until the process ends.
_SHARED_NAMES: dict[frozenset[str], frozenset[str]] = {_NO_NAMES: _NO_NAMES}
_SHARED_LIMIT = 4096


def marker_names(node: Any) -> frozenset[str]:
    """The names of every marker on ``node`` and its parents (what ``node.iter_markers()``
    yields), kept per node: a test's are its own markers' names added to its parent's, which
    its siblings share, so that a module's tests (and their definitions, which collection asks
    about first) cost one look at their own markers each, not a walk up the tree."""
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

    pluggy reads every name ``dir()`` lists of a plugin object it registers (for hooks), and
    pytest's fixture manager reads them all again at session start (for fixtures), each with a
    lookup through the class: the guard's and the report's hundred-odd names (their helpers and
    ``object``'s) cost every guarded session about 5 M instructions, some 2 ms. Neither plugin
    object defines a fixture, and every hook is a ``pytest_*`` method, so both find all they
    look for; the attributes themselves are untouched.
    """

    def __dir__(self: object) -> list[str]:  # a subclass's hooks and an instance's too
        return [name for name in object.__dir__(self) if name.startswith("pytest_")]

    cls.__dir__ = __dir__  # type: ignore[assignment,method-assign]
    return cls


def scanned_module_names(namespace: Mapping[str, Any]) -> Callable[[], list[str]]:
    """A plugin module's ``__dir__`` (PEP 562): its hooks (``pytest_*``) and fixtures only.

    pytest reads every name ``dir()`` lists of a module it registers as a plugin, twice (pluggy
    for hooks, the fixture manager for fixtures, with a wrapped-fixture check per name): the
    fixtures module's imports, helpers and constants cost every session with the plugin
    installed some 6 M instructions, about 2.5 ms. Call it at the end of the module, with its
    ``globals()``; the attributes themselves are untouched (``getattr`` and imports work as
    before), only ``dir()`` of the module lists less.
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
