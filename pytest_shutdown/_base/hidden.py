"""``contextmanager`` for helpers: a failure raised when the block ends shows the caller's line,
not a frame of ``contextlib.py`` (the ``__exit__`` is ``__tracebackhide__``; same semantics).
A helper used without its call (``with no_leaks:``) or with ``async with`` is a ``TypeError``
that says what to write.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar, cast

from pytest_shutdown._base.arguments import not_asynchronous, not_called

P = ParamSpec("P")
T = TypeVar("T")


class HiddenGeneratorContext(Generic[T]):
    """The context manager :func:`contextmanager` returns for one call."""

    def __init__(self, gen: Generator[T, None, None], name: str = "") -> None:
        self._gen = gen
        self._name = name

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

    async def __aenter__(self) -> Any:
        self._gen.close()  # never started: nothing of the helper ran
        raise not_asynchronous(self._name)

    async def __aexit__(self, *exc_info: object) -> None:
        return None


class HiddenContextFunction(Generic[P, T]):
    """What :func:`contextmanager` makes of a generator function: called, a context manager;
    itself in a ``with`` statement, a ``TypeError`` saying to call it."""

    def __init__(self, func: Callable[P, Iterator[T]]) -> None:
        functools.update_wrapper(self, func)
        self._func = func  # after: a func wrapping another one has that one's _func to copy

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> HiddenGeneratorContext[T]:
        gen = cast(Generator[T, None, None], self._func(*args, **kwargs))
        return HiddenGeneratorContext(gen, self._func.__name__)

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        """Bound like a function (also what makes :func:`inspect.isroutine` see one)."""
        return self if obj is None else types.MethodType(self, obj)

    def __enter__(self) -> Any:
        raise not_called(self._func.__name__)

    def __exit__(self, *exc_info: object) -> None:
        return None

    async def __aenter__(self) -> Any:
        raise not_asynchronous(self._func.__name__, called=False)

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<function {self._func.__module__}.{self._func.__qualname__}>"


def contextmanager(func: Callable[P, Iterator[T]]) -> HiddenContextFunction[P, T]:
    """Like :func:`contextlib.contextmanager`, minus the ``contextlib.py`` frame on failure."""
    return HiddenContextFunction(func)
