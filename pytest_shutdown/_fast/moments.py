"""One moment: a reading several resource kinds take of the same process state is taken once
per snapshot or check (:func:`one_moment`); outside a moment every call reads afresh.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["one_moment", "reading"]

T = TypeVar("T")

_readings: dict[str, Any] | None = None


def _forget_in_child() -> None:
    global _readings
    _readings = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class _Moment:
    """A class: a generator-based context manager costs several times as much."""

    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        global _readings
        self._outer = _readings is None
        if self._outer:
            _readings = {}

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _readings
        if self._outer:
            _readings = None


def one_moment() -> _Moment:
    """Readings taken inside the block are taken once (nested blocks share the outer one)."""
    return _Moment()


def reading(name: str, read: Callable[[], T]) -> T:
    """``read()``, or inside a moment the value it gave the first time in that moment."""
    readings = _readings
    if readings is None:
        return read()
    if name in readings:
        return readings[name]  # type: ignore[no-any-return]
    value = readings[name] = read()
    return value
