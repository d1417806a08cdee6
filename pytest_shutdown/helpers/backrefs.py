"""Moved to :mod:`pytest_shutdown.ownership.backrefs` (issue 47: the owner search and the atexit
records walk the same references, and they sit below the helpers); its names stay importable from
here.
"""

from __future__ import annotations

from pytest_shutdown.ownership.backrefs import (
    BACKREF_BUDGET_S,
    BACKREF_MAX_DEPTH,
    BACKREF_WALL_FACTOR,
    DOT_TIMEOUT_S,
    GRAPH_MAX_DEPTH,
    GRAPH_TOO_MANY,
    GRAPHS,
    NO_DOT_NOTE,
    PATH_BUDGET,
    BackrefGraph,
    GraphSettings,
    SearchGaveUp,
    _edges,
    _thread_frames,
    backref_chain,
    configure_graphs,
    draw_backrefs,
    find_path,
    render_chain,
    runs_through_finalizer_registry,
)

__all__ = [
    "BACKREF_BUDGET_S",
    "BACKREF_MAX_DEPTH",
    "BACKREF_WALL_FACTOR",
    "DOT_TIMEOUT_S",
    "GRAPHS",
    "GRAPH_MAX_DEPTH",
    "GRAPH_TOO_MANY",
    "NO_DOT_NOTE",
    "PATH_BUDGET",
    "BackrefGraph",
    "GraphSettings",
    "SearchGaveUp",
    "_edges",
    "_thread_frames",
    "backref_chain",
    "configure_graphs",
    "draw_backrefs",
    "find_path",
    "render_chain",
    "runs_through_finalizer_registry",
]
