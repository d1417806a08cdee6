"""``@lazy_dataclass``: a dataclass whose methods are generated when its first instance is made.

``dataclass`` compiles its methods with ``exec`` at class creation (0.25 ms a class, 0.55 ms a
frozen one): some thirty records, most never made in a clean session, were a quarter of the
guard's fixed cost. The class gets a ``__new__`` that completes it (once, under a lock); every
instance passes through ``__new__``, and ``inspect.signature(cls)`` completes it too. Not before
the first instance: ``dataclasses.fields(cls)``, subclassing: use it on leaf records only.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

__all__ = ["FrozenRecord", "lazy_dataclass"]

_T = TypeVar("_T", bound=type)
_lock = threading.RLock()
_PENDING = "__lazy_dataclass_options__"

if TYPE_CHECKING:  # pragma: no cover - type checkers treat it as dataclass itself
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


@overload
def lazy_dataclass(cls: _T, /) -> _T: ...


@overload
def lazy_dataclass(
    cls: None = None, /, *, frozen: bool = False, eq: bool = True
) -> Callable[[_T], _T]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def lazy_dataclass(
    cls: _T | None = None, /, *, frozen: bool = False, eq: bool = True
) -> _T | Callable[[_T], _T]:
    """``@lazy_dataclass`` / ``@lazy_dataclass(frozen=True, eq=False)``: see the module."""

    def defer(cls: _T) -> _T:
        setattr(cls, _PENDING, {"frozen": frozen, "eq": eq})
        cls.__new__ = staticmethod(_complete_then_new)  # type: ignore[assignment]
        cls.__signature__ = _SIGNATURE_OF_INIT  # type: ignore[attr-defined]
        return cls

    return defer(cls) if cls is not None else defer


class _SignatureOfInit:
    """``inspect.signature(cls)``: the generated ``__init__``'s, not ``__new__``'s."""

    def __get__(self, instance: object, owner: type) -> Any:
        if instance is not None:
            raise AttributeError("__signature__")
        import inspect  # noqa: PLC0415 - introspection only

        complete(owner)
        signature = inspect.signature(owner.__init__)  # type: ignore[misc]
        return signature.replace(parameters=list(signature.parameters.values())[1:])


_SIGNATURE_OF_INIT = _SignatureOfInit()


def _complete_then_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    for klass in reversed(cls.__mro__):
        complete(klass)
    return object.__new__(cls)


def _new(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


def complete(cls: type) -> type:
    """Generate ``cls``'s dataclass methods now (a no-op when done or not lazy)."""
    with _lock:
        options = cls.__dict__.get(_PENDING)
        if options is None:
            return cls
        delattr(cls, _PENDING)  # dataclass() asks inspect.signature(cls): done, for it
        # The methods before the lock-free __new__: another thread must find __init__ ready.
        dataclasses.dataclass(cls, **options)
        # Not ``del``: CPython keeps the slot, and object.__new__ would get the arguments.
        cls.__new__ = staticmethod(_new)  # type: ignore[assignment]
    return cls


class FrozenRecord:
    """An immutable record whose fields are its ``__slots__`` (nothing compiled, unlike a frozen
    dataclass), for the records every session makes. A subclass passes the values, in slot
    order, to ``FrozenRecord.__init__`` from a typed ``__init__`` of its own."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *values: Any) -> None:
        if len(values) != len(self.__slots__):
            raise TypeError(f"{type(self).__name__} takes {len(self.__slots__)} values")
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:  # copy and pickle through __init__
        return (type(self), self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"
