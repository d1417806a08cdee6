"""``atexit.register`` calls, recorded with their creation site while recording is on.

``atexit`` keeps its callbacks in a C array ``gc.get_referrers`` cannot see: an object held only
by ``atexit.register(self.shutdown)`` looks unowned, yet lives until exit. While recording
(:func:`install`, counted), ``atexit.register``/``unregister`` are wrapped and each registration
is kept until unregistered. A name bound before recording (``from atexit import register``) is
not seen; a forked child never inherits the wrappers.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.lazy_wrappers import LazyWrappers

__all__ = ["Registration", "holders_of", "install", "recording", "registrations", "uninstall"]


@lazy_dataclass(eq=False)
class Registration:
    """One ``atexit.register(func, *args, **kwargs)`` call still registered."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    test: str | None
    origin: Any = None  # pytest_shutdown.ownership.origins.Origin
    seq: int = 0

    def describe(self) -> str:
        func = getattr(self.func, "__func__", self.func)
        name = getattr(func, "__qualname__", None) or repr(func)
        module = getattr(func, "__module__", None)
        return f"{module}.{name}" if module else name


_registrations: list[Registration] = []
_seq = 0


def registrations() -> list[Registration]:
    """The recorded registrations still registered, oldest first."""
    return list(_registrations)


def count() -> int:
    """How many registrations were recorded so far."""
    return _seq


def since(seq: int) -> list[Registration]:
    """Registrations recorded after the snapshot ``seq`` and still registered."""
    return [r for r in _registrations if r.seq > seq]


def _wrap(module: Any) -> None:
    register, unregister = module.register, module.unregister

    def recording_register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        global _seq
        result = register(func, *args, **kwargs)
        try:
            if origins.is_tool_file(sys._getframe(1).f_code.co_filename):
                return result  # pytest's own (tmp_path's cleanup) and the tools' are never a test's
            _seq += 1
            _registrations.append(
                Registration(
                    func, args, kwargs, origins._current_test, origins.capture_here(), _seq
                )
            )
        except Exception:  # noqa: BLE001 - recording must never break a registration
            pass
        return result

    def recording_unregister(func: Callable[..., Any]) -> None:
        __tracebackhide__ = True
        unregister(func)
        _registrations[:] = [r for r in _registrations if not _same(r.func, func)]

    _wrappers.patch("register", module, "register", recording_register)
    _wrappers.patch("unregister", module, "unregister", recording_unregister)


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return a is b


def _forget() -> None:
    _registrations.clear()


_wrappers = LazyWrappers("atexit", _wrap, _forget)


def install() -> None:
    """Start recording (nested calls are counted)."""
    _wrappers.install()


def uninstall() -> None:
    """Put the originals back with the last nested call (only where nobody replaced ours)."""
    _wrappers.uninstall()
    if not _wrappers.installs:
        _registrations.clear()


@contextmanager
def recording() -> Iterator[None]:
    """Record ``atexit.register`` calls inside the block."""
    install()
    try:
        yield
    finally:
        uninstall()


_PLAIN = (type, types.ModuleType, types.BuiltinFunctionType, str, bytes, int, float, type(None))


def reached_objects(registration: Registration) -> list[object]:
    """Objects the callback and its arguments hold directly (functions, classes, modules and
    plain values left out)."""
    found: list[object] = []
    pending: list[object] = [registration.func, *registration.args, *registration.kwargs.values()]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, types.MethodType):
            pending.append(node.__self__)
        elif isinstance(node, functools.partial):
            pending.extend([node.func, *node.args, *(node.keywords or {}).values()])
        elif isinstance(node, types.FunctionType):
            pending.extend(c.cell_contents for c in node.__closure__ or () if _filled(c))
        elif not isinstance(node, _PLAIN):
            found.append(node)
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def holders_of(obj: object) -> list[Registration]:
    """Recorded registrations whose callback or arguments reach ``obj`` (forwards, bounded)."""
    from pytest_shutdown.ownership.backrefs import find_path  # noqa: PLC0415

    found = []
    for registration in list(_registrations):
        roots = [registration.func, *registration.args, *registration.kwargs.values()]
        if any(root is obj or find_path(root, obj) is not None for root in roots):
            found.append(registration)
    return found
