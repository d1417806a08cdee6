"""How a finding names a leaked thread or process as its user knows it: its name, what it runs
and the call that started it (``'pool' (target app.work, started by Pool.start at
app.py:22)``). Built from a record's plain facts, only when a finding is made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["callable_name", "process_label", "thread_label"]


def callable_name(target: object) -> str | None:
    """``module.qualname`` of a function or method; None for no callable."""
    if target is None:
        return None
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def thread_label(record: Mapping[str, Any]) -> str:
    """``'name' (target ..., started by F at file:line)``; the non-daemon note when it is one."""
    facts = []
    if record.get("target"):
        facts.append(f"target {record['target']}")
    if record.get("site"):
        facts.append(f"started by {record['site']}")
    label = repr(record.get("name")) + (f" ({', '.join(facts)})" if facts else "")
    if not record.get("daemon", True):
        label += " (non-daemon: it blocks the interpreter's exit)"
    return label


def process_label(record: Mapping[str, Any]) -> str:
    """``pid (Process 'name', target ..., started by F at file:line)``: a process object's
    description when one started it, else the executable's name, and the start call."""
    what = str(record.get("what") or record.get("name") or "?")
    site = record.get("site")
    if site:
        starter, _, where = str(site).partition(" at ")
        if what.endswith(f"started by {starter}"):
            what += f" at {where}"
        elif ", started by " in what:  # a library's method started it, called from the user's
            what += f", called from {site}"
        else:
            what += f", started by {site}"
    return f"{record.get('pid')} ({what})"
