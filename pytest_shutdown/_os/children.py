"""The one walk down a process tree: the children lists the kernel keeps per thread
(``/proc/PID/task/TID/children``), so that its cost follows the tree, never the host's process
table. The resources layer's descendant readings and the one tree killer both walk with it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = ["children_of", "walk_descendants"]


def children_of(pid: int, tasks: Callable[[], list[str]] | None = None) -> list[int] | None:
    """The children of ``pid`` (``tasks``: its thread ids, when the caller has them already);
    empty when it is gone, None where the kernel keeps no children lists."""
    try:
        tids = tasks() if tasks is not None else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    found: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
        except FileNotFoundError:
            if tid == str(pid) and os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # the kernel was built without CONFIG_PROC_CHILDREN
            continue
        except OSError:
            continue
        try:
            data = os.read(fd, 65536)
            while len(data) % 65536 == 0 and data:  # a very wide tree: read on
                more = os.read(fd, 65536)
                if not more:
                    break
                data += more
        except OSError:
            data = b""
        finally:
            os.close(fd)
        found.extend(int(p) for p in data.split())
    return found


def walk_descendants(
    pid: int, own_tasks: Callable[[], list[str]] | None = None
) -> list[int] | None:
    """Every descendant of ``pid``, parents before their children (``own_tasks``: the thread
    ids of ``pid``, when it is this process and the caller keeps them); None where the kernel
    keeps no children lists (elsewhere than Linux, or without ``CONFIG_PROC_CHILDREN``)."""
    if not sys.platform.startswith("linux"):
        return None
    seen: dict[int, None] = {}
    stack = [pid]
    while stack:
        parent = stack.pop()
        children = children_of(parent, own_tasks if parent == pid else None)
        if children is None:
            return None
        for child in children:
            if child not in seen and child != pid:
                seen[child] = None
                stack.append(child)
    return list(seen)
