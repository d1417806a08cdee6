"""What a forked child must not inherit from the plugin.

``os.fork()`` copies the plugin's SIGTERM handler, its wrapped ``start`` methods, its open
files: a child keeping the handler no longer dies on ``terminate()`` (a pool's workers hang).
So each piece registers an undo here, and one ``register_at_fork`` hook runs them in the child
before its own code. A child forked in C runs none: what it inherits must check its pid itself
(:mod:`pytest_shutdown.plugin.interrupts` does).

A Python handler runs only at the child's first bytecode boundary, maybe inside the undo: so
the signals whose handlers are undone stay blocked across the fork, and the child unblocks them
after the undo (a SIGTERM that came meanwhile then gets the default action).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

__all__ = ["forget_in_child", "this_pid", "undo_in_forked_child"]

try:  # signal.pthread_sigmask makes an enum of every signal of the mask (twice a fork)
    from _signal import pthread_sigmask as _sigmask
except ImportError:  # pragma: no cover - another interpreter
    _sigmask = signal.pthread_sigmask

_undos: dict[str, Callable[[], None]] = {}
_held: dict[str, frozenset[int]] = {}
_hooked = False
_fork_state = threading.local()  # the forking thread's mask, kept across the fork
_pid = os.getpid()


def this_pid() -> int:
    """``os.getpid()`` without a system call (asked a dozen times a test), kept current in every
    child forked through ``os.fork``."""
    return _pid


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)


def undo_in_forked_child(key: str, undo: Callable[[], None], *, hold: Iterable[int] = ()) -> None:
    """Run ``undo`` in every child forked from now on (until :func:`forget_in_child` of
    ``key``); the signals in ``hold`` stay blocked until it has run."""
    global _hooked
    _undos[key] = undo
    _held[key] = frozenset(hold)
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before, after_in_parent=_restore_mask, after_in_child=_in_child)
        _hooked = True


def forget_in_child(key: str) -> None:
    """The parent put back what ``key`` installed: a fork no longer needs to undo it."""
    _undos.pop(key, None)
    _held.pop(key, None)


def _before() -> None:
    held = frozenset().union(*_held.values()) if _held else frozenset()
    _fork_state.mask = _sigmask(signal.SIG_BLOCK, held) if held else None


def _restore_mask() -> None:
    mask = getattr(_fork_state, "mask", None)
    _fork_state.mask = None
    if mask is not None:
        _sigmask(signal.SIG_SETMASK, mask)


def _in_child() -> None:
    undos = list(_undos.values())
    _undos.clear()
    _held.clear()
    for undo in undos:
        try:
            undo()
        except Exception:  # pragma: no cover - an undo must never break the child's start
            pass
    _restore_mask()
