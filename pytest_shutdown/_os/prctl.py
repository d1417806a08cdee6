"""Linux ``prctl(2)`` through libc; elsewhere the calls do nothing and return False (or None).

libc is looked up at import: a ``dlopen`` in a child forked from a multi-threaded parent can
deadlock. The call goes through ``_ctypes``: the ``ctypes`` package costs 3 ms, this 1 ms.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

__all__ = [
    "PR_GET_CHILD_SUBREAPER",
    "PR_SET_CHILD_SUBREAPER",
    "PR_SET_NAME",
    "PR_SET_PDEATHSIG",
    "prctl",
    "prctl_get_int",
]


def _load_prctl() -> tuple[Any, Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import _ctypes  # noqa: PLC0415 - Linux only
    except ImportError:  # pragma: no cover - a Python built without ctypes
        return None

    class CInt(_ctypes._SimpleCData):  # type: ignore[name-defined,misc]
        _type_ = "i"

    class CFunction(_ctypes.CFuncPtr):  # type: ignore[name-defined,misc]
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = CInt

    class Libc:  # what CFuncPtr((name, library)) reads: the library's handle
        _handle = _ctypes.dlopen(None, os.RTLD_LOCAL)  # type: ignore[arg-type]

    try:
        return CFunction(("prctl", Libc())), CInt  # type: ignore[arg-type]
    except (AttributeError, OSError):
        return None


_PRCTL = _load_prctl()


def prctl(option: int, arg: int | bytes) -> bool:
    """``prctl(option, arg, 0, 0, 0)``; True when it succeeded (``arg``: an int or bytes)."""
    if _PRCTL is None:
        return False
    function, _ = _PRCTL
    return bool(function(option, arg, 0, 0, 0) == 0)


def prctl_get_int(option: int) -> int | None:
    """The int a ``PR_GET_*`` option writes through its pointer argument; None on failure."""
    if _PRCTL is None:
        return None
    import _ctypes  # noqa: PLC0415 - loaded already by _load_prctl

    function, c_int = _PRCTL
    value = c_int(0)
    if function(option, _ctypes.byref(value), 0, 0, 0) != 0:
        return None
    return int(value.value)
