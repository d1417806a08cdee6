"""Processes a test did not start that died by a signal while it ran (``collateral-kill``).

A shutdown that kills what it does not own (SGLang's ``Engine.shutdown()`` kills every
descendant of the pytest process) passes its own test and breaks every later one. The victims
are the descendants alive before the test; one that ended since by a signal (read from its
zombie, or its ``Popen.returncode`` / ``Process.exitcode`` once reaped) is reported, unless the
session ordered its end or its owner killed, reaped and dropped it (that owner's cleanup).
A process on its way out when the snapshot is taken (a fatal signal pending, or its exit
running) is no victim. Nothing is read while every process of the snapshot is there and no
child is a zombie.
A grandchild reaped by its own parent leaves no trace. Nothing is restored.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Sequence
from typing import Any

from pytest_shutdown._fast.cheap import process_name
from pytest_shutdown._os.killer import ordered_end_of
from pytest_shutdown._os.proc_stat import process_ending, stat_fields
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.ownership import origins, signals_sent
from pytest_shutdown.ownership.containment import exit_signal, is_zombie
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind
from pytest_shutdown.resources.primitives import child_state, descendant_pids
from pytest_shutdown.resources.processes import REPORTED

__all__ = ["CollateralKind", "signal_name"]


def _zombie_child_exists() -> bool:
    return bool(child_state())


def _living_descendants() -> frozenset[int]:
    """Descendants less the zombies among them (a process dead before the test is no victim)."""
    pids = descendant_pids()
    if not pids or not _zombie_child_exists():
        return pids
    return frozenset(pid for pid in pids if not is_zombie(pid))


def _possible_victims() -> frozenset[int]:
    """The descendants a signal sent from now on could kill: less those already ended or on
    their way out. A process killed at the end of one test (vLLM's ``shutdown()`` SIGKILLs an
    EngineCore it does not wait for) may take tens of milliseconds to become a zombie (freeing
    its memory): the next test did not kill it."""
    return frozenset(pid for pid in descendant_pids() if not process_ending(pid))


def _last_signal(pid: int) -> signals_sent.Sent | None:
    """The last signal this process sent to ``pid`` or to its process group (read only when a
    group was signalled: a zombie keeps its group)."""
    return signals_sent.last_sent(pid, _group_of(pid) if signals_sent.groups_signalled() else None)


def _sent_before_this_test(sent: signals_sent.Sent | None, sig: int) -> bool:
    """Whether ``sent`` is the signal ``sig`` that ended its process, sent before the running
    test began: an earlier test stopped it and did not wait while it drained."""
    return sent is not None and sent.signal == sig and sent.test != origins.current_test()


def _sender(sent: origins.Origin) -> str | None:
    """The call that sent the signal as a user reads it: the innermost frame outside psutil (its
    ``send_signal``/``kill`` is how a signal was sent, not who sent it)."""
    frames = tuple(f for f in sent.frames if f"{os.sep}psutil{os.sep}" not in f[0]) or sent.frames
    return origins.start_site(origins.Origin(frames, sent.test))


def _group_of(pid: int) -> int | None:
    """The process group of ``pid`` (a zombie keeps it); None once it is reaped."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    return int(fields[2]) if fields is not None and fields[2].isdigit() else None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _owner_signal(pid: int) -> int | None:
    """The signal that ended ``pid`` according to its reaped Popen/Process object."""
    obj = origins.process_object(pid)
    code = getattr(obj, "returncode", None)
    if code is None:
        code = getattr(obj, "exitcode", None)
    return -code if isinstance(code, int) and code < 0 else None


class CollateralKind(ObjectKind):
    """Items: ``(pid, signal, name, sent)`` of processes alive at the snapshot that died by a
    signal; ``sent``: the :class:`~pytest_shutdown.ownership.origins.Origin` of the call of this
    test that sent it, where recorded."""

    name = "collateral"
    allow_key = "collateral"
    mark = "childless"

    def __init__(self) -> None:
        self._reported: set[tuple[int, int]] = set()
        signals_sent.install()

    def close(self) -> None:
        signals_sent.uninstall()

    def fingerprint(self) -> frozenset[int] | tuple[frozenset[int], bool]:
        pids = descendant_pids()
        if not pids:
            return pids  # no child: none can have died
        return (_living_descendants(), _zombie_child_exists())

    def snapshot(self) -> frozenset[int]:
        return _possible_victims()

    def absorb(self, before: Any, start: Any, end: Any) -> Any:
        return before | _possible_victims()  # a fixture's processes are victims from now on

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[Any]:
        if allow is True or not before:
            return ()
        now = descendant_pids()
        gone = before - now
        if not gone and not _zombie_child_exists():
            return ()  # every earlier process is still there and none of ours is a zombie
        found: list[tuple[int, int]] = []
        reaped: list[int] = []
        sites: dict[int, origins.Origin] = {}  # where this test sent the fatal signal
        for pid in sorted(before):
            if pid in gone:
                sig = _owner_signal(pid)
            elif is_zombie(pid):
                sig = exit_signal(pid)
            else:
                continue
            if sig is None or (pid, sig) in self._reported or ordered_end_of(pid) is not None:
                continue
            if pid in REPORTED:  # an earlier test's reported leak: ending it is cleaning up
                continue
            sent = _last_signal(pid)
            if _sent_before_this_test(sent, sig):
                continue
            found.append((pid, sig))
            if sent is not None and sent.signal == sig and sent.origin is not None:
                sites[pid] = sent.origin
            if pid in gone:
                reaped.append(pid)
        if reaped:
            found = self._without_dropped_owners(found, reaped)
        victims = []
        for pid, sig in found:
            self._reported.add((pid, sig))
            victims.append((pid, sig, self._name(pid), sites.get(pid)))
        return tuple(victims)

    @staticmethod
    def _without_dropped_owners(
        found: list[tuple[int, int]], reaped: list[int]
    ) -> list[tuple[int, int]]:
        """Less the processes known only through a reaped ``Process``/``Popen`` object that is
        garbage (its owner killed, reaped and dropped it). Collections decide it, so that the
        verdict does not hang on whether gc freed the object before the check."""
        dropped: set[int] = set()
        for generation in (1, 2):
            gc.collect(generation)
            dropped = {pid for pid in reaped if _owner_signal(pid) is None}
            if len(dropped) == len(reaped):
                break
        return [(pid, sig) for pid, sig in found if pid not in dropped]

    def _name(self, pid: int) -> str:
        origin = origins.origin_of_process(pid)
        if origin is not None and origin.what:
            return origin.what
        name = process_name(pid)
        if name == "?":  # reaped: its Popen still says what it ran
            args = getattr(origins.process_object(pid), "args", None)
            first = args.split()[0] if isinstance(args, str) and args.split() else None
            if isinstance(args, (list, tuple)) and args:
                first = str(args[0])
            name = os.path.basename(first) if first else name
        return name

    def settle(self, items: Sequence[Any], deadline: float) -> Sequence[Any]:
        return items  # a death is final

    def findings(
        self, items: Sequence[Any], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        if not items:
            return []
        victims = []
        for pid, sig, name, sent in items:
            origin = origins.origin_of_process(pid)
            victims.append(
                {
                    "pid": pid,
                    "name": name,
                    "signal": signal_name(sig),
                    "sent_from": _sender(sent) if sent is not None else None,
                    "sent_at": origins.render_origin(sent) if sent is not None else "",
                    "started_in": origin.test if origin is not None else None,
                    "started_at": origins.render_origin(origin) if origin is not None else "",
                }
            )
        described = ", ".join(
            f"{v['pid']} ({v['name']}) by {v['signal']}"
            + (f" (sent by {v['sent_from']})" if v["sent_from"] else "")
            for v in victims
        )
        count = len(victims)
        return [
            Finding(
                "collateral-kill",
                f"{count} process{'es' if count != 1 else ''} {subject} did not start "
                f"(alive before it, a wider-scope fixture's or an earlier test's) died by a "
                f"signal during {subject}: {described}.",
                {"victims": victims, "test": subject, **dict(extra or {})},
            )
        ]
