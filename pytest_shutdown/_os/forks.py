"""What a forked child must not inherit from the plugin.

``os.fork()`` copies the whole interpreter: the plugin's SIGTERM handler, its wrapped
``Thread.start``/``Process.start``/``Popen.__init__``, its record log's open file. A child that
keeps the SIGTERM handler no longer dies on ``Process.terminate()`` or ``Pool.terminate()``: it
raises :class:`~pytest_shutdown.interrupts.SigtermInterrupted` instead, exits 1, and a pool's
workers hang on their queue. So every piece of the plugin that a fork would inherit registers an
undo here, and one ``os.register_at_fork(after_in_child=...)`` hook (installed once, never
removable) runs them in the child, before any of the child's own code: the child then behaves
exactly as it would without the plugin. ``multiprocessing``'s fork and forkserver start methods
both go through ``os.fork``; spawn and ``subprocess`` start a fresh interpreter and inherit no
Python state at all. A child forked in C (``fork()`` through ctypes or a C extension) runs none of
these hooks: what it inherits must see for itself that it is not in the process that installed it
(:mod:`pytest_shutdown.interrupts` does, for its handler and its watch).

A Python-level handler runs only at the child's first bytecode boundary, which can be inside the
undo itself: a SIGTERM sent right after the fork (``terminate()`` on a busy machine) would still
reach the inherited handler. So the signals whose handlers are undone are blocked in the forking
thread across the fork; the child unblocks them only after the undo, and a SIGTERM that arrived
in between then gets the default action, exactly as without the plugin. The parent unblocks them
at once and handles what arrived as before.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

__all__ = ["forget_in_child", "this_pid", "undo_in_forked_child"]

try:  # the C function: signal.pthread_sigmask turns every signal of the mask into an enum
    from _signal import pthread_sigmask as _sigmask  # (a fork pays it twice)
except ImportError:  # pragma: no cover - another interpreter
    _sigmask = signal.pthread_sigmask

_undos: dict[str, Callable[[], None]] = {}
_held: dict[str, frozenset[int]] = {}
_hooked = False
_fork_state = threading.local()  # the forking thread's mask, kept across the fork
_pid = os.getpid()


def this_pid() -> int:
    """``os.getpid()`` without a system call per question (the per-test checks ask it a dozen
    times): kept current in every child forked through ``os.fork`` (multiprocessing's fork and
    forkserver, ``subprocess`` with a ``preexec_fn``: all run the fork hooks before the child's
    first Python code)."""
    return _pid


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)


def undo_in_forked_child(
    key: str, undo: Callable[[], None], *, hold: Iterable[int] = ()
) -> None:
    """Run ``undo`` in every child forked from now on (until :func:`forget_in_child` is called
    with the same ``key``); the signals in ``hold`` stay blocked until it has run. A later
    registration under the same key replaces the earlier one."""
    global _hooked
    _undos[key] = undo
    _held[key] = frozenset(hold)
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before, after_in_parent=_in_parent, after_in_child=_in_child)
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


def _in_parent() -> None:
    _restore_mask()


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
