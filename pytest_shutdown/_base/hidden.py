"""``contextmanager`` for helpers: a failure raised when the block ends shows the caller's line,
not a frame of ``contextlib.py`` (the ``__exit__`` is ``__tracebackhide__``; same semantics).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Generic, ParamSpec, TypeVar, cast

P = ParamSpec("P")
T = TypeVar("T")


class HiddenGeneratorContext(Generic[T]):
    """The context manager :func:`contextmanager` returns for one call."""

    def __init__(self, gen: Generator[T, None, None]) -> None:
        self._gen = gen

    def __enter__(self) -> T:
        __tracebackhide__ = True
        try:
            return next(self._gen)
        except StopIteration:
            raise RuntimeError("generator didn't yield") from None

    def __exit__(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        __tracebackhide__ = True
        if typ is None:
            try:
                next(self._gen)
            except StopIteration:
                return False
            raise RuntimeError("generator didn't stop")
        if value is None:
            value = typ()
        try:
            self._gen.throw(value)
        except StopIteration as stop:
            return stop is not value  # the generator swallowed the block's exception
        except BaseException as raised:
            if raised is value:  # the block's own exception: let the with statement re-raise it
                raised.__traceback__ = traceback
                return False
            raise
        raise RuntimeError("generator didn't stop after throw()")


def contextmanager(func: Callable[P, Iterator[T]]) -> Callable[P, HiddenGeneratorContext[T]]:
    """Like :func:`contextlib.contextmanager`, minus the ``contextlib.py`` frame on failure."""

    @functools.wraps(func)
    def helper(*args: P.args, **kwargs: P.kwargs) -> HiddenGeneratorContext[T]:
        return HiddenGeneratorContext(cast(Generator[T, None, None], func(*args, **kwargs)))

    return helper
