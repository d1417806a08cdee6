"""What keeps a grown object alive: a shortest backref chain, one heap scan per level.

``objgraph.find_backref_chain`` scans the whole heap once per node it expands (too slow on a busy
200,000-object heap); here ``gc.get_referrers(*frontier)`` takes a whole level per scan, so a
chain of depth *d* costs *d* scans. Roots are modules and running threads' frames; the search's
own containers and the caller's frames are never part of a chain.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from typing import Any

from pytest_shutdown.ownership.backrefs import _thread_frames, render_chain

#: Levels searched at most, and seconds the search may take before it gives up.
MAX_DEPTH = 16
BUDGET_S = 5.0


def _is_root(obj: object) -> bool:
    if isinstance(obj, types.FrameType):
        return True
    if isinstance(obj, types.ModuleType):
        name = getattr(obj, "__name__", None)
        return isinstance(name, str) and sys.modules.get(name) is obj
    return False


def holder_chain(target: object) -> tuple[list[Any], str]:
    """A shortest chain ``[root, ..., target]`` and its text (``[target]`` and a note when no
    root is found within :data:`MAX_DEPTH` levels or :data:`BUDGET_S` seconds)."""
    deadline = time.monotonic() + BUDGET_S
    frames, owner = _thread_frames()
    ignore: set[int] = {id(frames), id(owner)}
    walker: types.FrameType | None = sys._getframe()
    while walker is not None:  # this search and its callers are not the story
        ignore.add(id(walker))
        walker = walker.f_back
    del walker
    parent: dict[int, int] = {}
    found: dict[int, Any] = {id(target): target}
    ignore |= {id(parent), id(found)}
    frontier: list[Any] = [target]
    chain: list[Any] = [target]
    try:
        for _ in range(MAX_DEPTH):
            if not frontier or time.monotonic() > deadline:
                break
            level = {id(node) for node in frontier}
            referrers = gc.get_referrers(*frontier)
            ignore |= {id(referrers), id(frontier), id(level)}
            following: list[Any] = []
            ignore.add(id(following))
            root = None
            for referrer in referrers:
                key = id(referrer)
                if key in found or key in ignore:
                    continue
                child = next((c for c in gc.get_referents(referrer) if id(c) in level), None)
                if child is None:
                    continue
                parent[key] = id(child)
                found[key] = referrer
                if _is_root(referrer):
                    root = referrer
                    break
                following.append(referrer)
            del referrers
            if root is not None:
                chain = [root]
                key = id(root)
                while key in parent:
                    key = parent[key]
                    chain.append(found[key])
                break
            frontier = following
    finally:
        found.clear()
        parent.clear()
        del frontier
    text = (
        render_chain(chain, owner)
        if len(chain) > 1
        else "no root (a module or a thread's frame) found within the search's depth and time"
    )
    del frames
    return chain, text
