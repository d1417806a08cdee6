"""The names of a node's markers, looked up once per node (collection, the guard and the
cycles hook all ask)."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["ORPHAN_MATRIX", "SHUTDOWN_MATRIX", "marker_names"]

#: The timeout matrix's marker (:mod:`pytest_shutdown.matrix`) and the orphan matrix's
#: (:mod:`pytest_shutdown.orphan_matrix`), named here so that the fixtures module can check for
#: them without importing either.
SHUTDOWN_MATRIX = "shutdown_matrix"
ORPHAN_MATRIX = "orphan_matrix"

_MARKER_NAMES_KEY = pytest.StashKey[frozenset[str]]()


def marker_names(node: Any) -> frozenset[str]:
    """The names of every marker on ``node`` and its parents: one walk up the tree, kept in
    the node's stash, so that a test without this plugin's markers costs no further lookup."""
    names = node.stash.get(_MARKER_NAMES_KEY, None)
    if names is None:
        names = frozenset(mark.name for mark in node.iter_markers())
        node.stash[_MARKER_NAMES_KEY] = names
    return names
