"""Linux ``prctl(2)`` through libc, shared by the engine's lifelines and the tree launcher.

libc is loaded once, at import: a ``dlopen`` in a child forked from a multi-threaded parent can
deadlock on the loader's lock. Everywhere else (or where libc has no ``prctl``) the calls do
nothing and return False.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def prctl(option: int, arg: object) -> bool:
    """``prctl(option, arg, 0, 0, 0)``; True when it succeeded, False elsewhere or on failure."""
    if _LIBC is None:
        return False
    try:
        return bool(_LIBC.prctl(option, arg, 0, 0, 0) == 0)
    except AttributeError:
        return False
