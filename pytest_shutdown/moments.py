"""One moment: a reading several resource kinds take of the same process state (its
descendants, its open descriptor count, ``/dev/shm``) is taken once per snapshot or check.

The guard wraps each snapshot of every kind, and each first pass of its check, in
:func:`one_moment`; inside it :func:`reading` answers a reading it already took. Outside a
moment (the grace's polling, the helpers) every call reads afresh.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["one_moment", "reading"]

T = TypeVar("T")

_readings: dict[str, Any] | None = None
_pid = 0


@contextlib.contextmanager
def one_moment() -> Iterator[None]:
    """Readings taken inside the block are taken once (nested blocks share the outer one)."""
    global _readings, _pid
    if _readings is not None and _pid == os.getpid():
        yield
        return
    _readings, _pid = {}, os.getpid()
    try:
        yield
    finally:
        _readings = None


def reading(name: str, read: Callable[[], T]) -> T:
    """``read()``, or inside a moment the value it gave the first time in that moment."""
    readings = _readings
    if readings is None or _pid != os.getpid():
        return read()
    if name in readings:
        return readings[name]  # type: ignore[no-any-return]
    value = readings[name] = read()
    return value
