"""Which frames of a blocked thread are the caller's code: Python's own modules and this
package's helpers are what it called, never where it was (a finding names the caller's line)."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence
from typing import Any

from pytest_shutdown.ownership.origins import short_path

#: The helpers' own folder: its frames are never the blocking site.
_HELPERS_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB_DIRS = tuple(
    os.path.abspath(path)
    for path in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")}
    if path
)


def is_library(filename: str) -> bool:
    """Python's own modules (asyncio, threading, socket) and this package's: not a blocking site."""
    path = os.path.abspath(filename)
    if path.startswith(_HELPERS_DIR + os.sep):
        return True
    if "site-packages" in path or "dist-packages" in path:
        return False
    return filename.startswith("<") or path.startswith(_STDLIB_DIRS)


def blocked_in(frames: Sequence[Any]) -> str:
    """Where a thread waits, from its frames (innermost first): the call the caller's innermost
    frame made, as ``Process.join called from Engine.shutdown at engine.py:40``, or that frame
    alone when it is the innermost ("" when every frame is a library's)."""
    mine = next((i for i, f in enumerate(frames) if not is_library(f.f_code.co_filename)), None)
    if mine is None:
        return ""
    frame = frames[mine]
    where = f"{function_of(frame)} at {short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f"{function_of(frames[mine - 1])} called from {where}" if mine else where


def function_of(frame: Any) -> str:
    """``Class.method`` (of the ``self`` it runs on: ``Process.join``, not ``BaseProcess.join``),
    else the function's qualified name."""
    code = frame.f_code
    owner = frame.f_locals.get("self")
    if owner is not None and not isinstance(owner, type):
        return f"{type(owner).__qualname__}.{code.co_name}"
    return getattr(code, "co_qualname", code.co_name)
