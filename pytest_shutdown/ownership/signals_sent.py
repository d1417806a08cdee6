"""The signals this process sent to other processes, and the test that sent each.

``collateral-kill`` reads them: a process a test stopped without waiting for it (``terminate()``
and return) may drain for a while and die of that signal during the next test; the next test
sent nothing and is not its killer. ``os.kill`` and ``os.killpg`` are wrapped while a guard
records (installed by the collateral kind); every way Python code sends a signal goes through
them: ``Popen.send_signal``/``terminate``/``kill``, ``multiprocessing``'s ``Process`` methods,
psutil's. A signal sent from C code, or by another process, leaves no record.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, NamedTuple

from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.lazy_wrappers import LazyWrappers

__all__ = ["Sent", "groups_signalled", "install", "last_sent", "uninstall"]

#: How many processes and groups are remembered (the oldest go first).
LIMIT = 4096


class Sent(NamedTuple):
    """The last signal sent to a process or a process group: which, during which test (None:
    between tests), and the call that sent it."""

    signal: int
    test: str | None
    origin: origins.Origin | None


_to_pids: OrderedDict[int, Sent] = OrderedDict()
_to_groups: OrderedDict[int, Sent] = OrderedDict()


def _remember(table: OrderedDict[int, Sent], target: Any, sig: Any) -> None:
    if not isinstance(target, int) or not isinstance(sig, int) or sig == 0 or target <= 0:
        return  # signal 0 only asks whether it exists; -1 and 0 are broadcasts, not a target
    try:
        table[target] = Sent(sig, origins.current_test(), origins._capture(depth=3))
        table.move_to_end(target)
        if len(table) > LIMIT:
            table.popitem(last=False)
    except Exception:  # noqa: BLE001 - recording never breaks a kill (a __del__ at exit)
        pass


def _wrap(module: Any) -> None:
    kill, killpg = module.kill, module.killpg

    def recording_kill(pid: int, sig: int, /) -> None:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        kill(pid, sig)
        if isinstance(pid, int) and pid < -1:
            _remember(_to_groups, -pid, sig)
        else:
            _remember(_to_pids, pid, sig)

    def recording_killpg(pgid: int, sig: int, /) -> None:
        __tracebackhide__ = True
        killpg(pgid, sig)
        _remember(_to_groups, pgid, sig)

    _wrappers.patch("kill", module, "kill", recording_kill)
    _wrappers.patch("killpg", module, "killpg", recording_killpg)


def _forget() -> None:
    _to_pids.clear()
    _to_groups.clear()


_wrappers = LazyWrappers("os", _wrap, _forget)


def install() -> None:
    """Start recording (nested calls are counted); a no-op where ``os`` has no ``killpg``."""
    if hasattr(os, "killpg"):
        _wrappers.install()


def uninstall() -> None:
    """Put the originals back with the last nested call (only where nobody replaced ours)."""
    if hasattr(os, "killpg"):
        _wrappers.uninstall()
        if not _wrappers.installs:
            _forget()


def last_sent(pid: int, group: int | None = None) -> Sent | None:
    """The last signal this process sent to ``pid``, or else to its process ``group``; None
    when it sent none that was recorded."""
    sent = _to_pids.get(pid)
    if sent is None and group is not None:
        sent = _to_groups.get(group)
    return sent


def groups_signalled() -> bool:
    """Whether a signal to a process group was recorded (else a victim's group is not read)."""
    return bool(_to_groups)
