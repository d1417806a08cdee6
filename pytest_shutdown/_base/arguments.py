"""The public helpers' usage errors, raised at once, before any shutdown runs: each names the
helper, the argument, what it got and the fix. ``TypeError`` for the wrong kind of thing (no
object, a class where an instance is expected, something not callable, a helper not called),
``ValueError`` for a value of the right kind that is out of range (a method the object lacks, a
negative budget).
"""

from __future__ import annotations

import math
from typing import Any


def require_instance(helper: str, argument: str, value: object, expected: str) -> None:
    """``value`` is an object, not ``None`` nor a class (``expected`` says what it should be:
    ``"the object to shut down"``)."""
    if value is None:
        raise TypeError(f"{helper}: `{argument}` is None, expected {expected}")
    if isinstance(value, type):
        name = value.__qualname__
        raise TypeError(
            f"{helper}: `{argument}` is the class {name}, expected an instance: pass {name}(...)"
        )


def require_method(helper: str, argument: str, value: object, method: object) -> None:
    """``value`` is an instance with a callable ``method`` (named by a str)."""
    require_instance(helper, argument, value, "the object to shut down")
    if not isinstance(method, str) or not method:
        raise TypeError(f"{helper}: `method` must be the name of a method (a str), got {method!r}")
    if not callable(getattr(value, method, None)):
        raise ValueError(
            f"{helper}: `{argument}` ({type(value).__qualname__}) has no callable {method!r}: "
            "pass the name of its shutdown method, e.g. method='close'"
        )


def require_callable(helper: str, argument: str, value: object, expected: str) -> None:
    """``value`` is callable (``expected`` says what it should be: ``"a function that builds a
    fresh engine"``); an instance given instead is named with its class."""
    if value is None:
        raise TypeError(f"{helper}: `{argument}` is None, expected {expected}")
    if not callable(value):
        raise TypeError(
            f"{helper}: `{argument}` is {_what(value)}, not callable; expected {expected}"
        )


def require_seconds(helper: str, argument: str, value: object, *, zero_ok: bool = False) -> None:
    """``value`` is a finite number of seconds (not a bool): > 0, or >= 0 with ``zero_ok``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{helper}: `{argument}` must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{helper}: `{argument}` must be seconds {bound}, got {value!r}")


def not_called(name: str, asynchronous: bool = False) -> TypeError:
    """The error of ``with helper:`` (the helper itself, not what calling it returns)."""
    statement = "async with" if asynchronous else "with"
    return TypeError(f"{name} is a function: write `{statement} {name}():`")


def not_asynchronous(name: str, called: bool = True) -> TypeError:
    """The error of ``async with helper():`` (or ``async with helper:``) for a helper that is a
    sync context manager."""
    what = f"{name}() is" if called else f"{name} is a function, and"
    return TypeError(f"{what} a sync context manager: write `with {name}():`")


class CalledBeforeWith(type):
    """The metaclass of a context manager class used like a function (``with no_task_leaks():``):
    ``with no_task_leaks:`` is a :func:`not_called` error instead of Python's own."""

    def __enter__(cls) -> Any:
        raise not_called(cls.__name__)

    def __exit__(cls, *exc_info: object) -> None:
        return None

    async def __aenter__(cls) -> Any:
        raise not_called(cls.__name__, asynchronous=True)

    async def __aexit__(cls, *exc_info: object) -> None:
        return None


def _what(value: object) -> str:
    kind = type(value).__qualname__
    text = repr(value)
    if len(text) > 60 or text.startswith("<"):
        return f"an instance of {kind}"
    return f"{text} (a {kind})"
