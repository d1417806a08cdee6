"""The value every assertion helper returns when its contract holds."""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass


@lazy_dataclass(frozen=True)
class CheckReport:
    """What a passing check observed, for tests that want to look closer.

    ``check`` names the helper (``"idempotent-shutdown"``, ``"finalizes-on-gc"``, ...);
    ``subject`` names the object checked; ``duration_s`` is the wall time of the whole check.
    ``cleanups`` maps each discovered cleanup (``"_executor.shutdown"``) to its call counts per
    round (``{"call 1": 1, "call 2": 0, "gc": 0}``); ``timings`` holds named durations in seconds;
    ``details`` holds any other JSON-serialisable facts.
    """

    check: str
    subject: str
    duration_s: float
    cleanups: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)

    def performed(self, round_name: str) -> list[str]:
        """The cleanups that ran at least once in ``round_name``."""
        return [label for label, counts in self.cleanups.items() if counts.get(round_name, 0)]


def is_seconds(value: object, *, zero_ok: bool = False) -> bool:
    """A finite number (not a bool) of seconds: > 0, or >= 0 with ``zero_ok``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value >= 0 if zero_ok else value > 0


def raised(exc: BaseException) -> dict[str, str]:
    """The details of a finding about a call that raised ``exc``."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"exception": repr(exc), "traceback": text}


def describe(obj: object) -> str:
    """A short, stable name for an object in messages: ``ReferenceRenderer at 0x7f..``."""
    return f"{type(obj).__qualname__} at {id(obj):#x}"
