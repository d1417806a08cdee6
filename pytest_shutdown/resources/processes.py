"""Processes: descendants of the pytest process a test started and left running
(``process-leak``), however they were re-parented (see
:mod:`pytest_shutdown.ownership.containment`)."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown._os import escaped
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.containment import (
    _subreaper_now,
    _test_named_in,
    first_ancestor,
    reap_adopted,
    started_in_test,
)
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind, SessionEndContext
from pytest_shutdown.resources.labels import process_label
from pytest_shutdown.resources.primitives import (
    Started,
    _walk_descendants,
    await_exit,
    descendant_pids,
    kill_process_trees,
    leak_findings,
    modules_named,
    multiprocessing_helper_pids,
    process_running,
)

__all__ = ["REPORTED", "UNKNOWN_SITE", "ProcessKind", "parent_pids"]

#: A leaked process's ``started_at`` when no start was recorded for it nor a matched ancestor.
UNKNOWN_SITE = (
    "unknown: no Popen or multiprocessing start was recorded for it or an ancestor (a bare "
    "os.fork, os.posix_spawn, native code, or a start outside the test's Python code)"
)

#: Pids reported as ``process-leak`` (oldest dropped first): a later test that ends one of
#: them is cleaning up, not killing a bystander (see the collateral kind).
REPORTED: dict[int, None] = {}

#: Extra looks of the fail-mode sweep for a process that forked and exited before the kill.
_SWEEP_ROUNDS = 5


class ProcessKind(ObjectKind):
    """Descendant processes by pid (see :func:`~.primitives.descendant_pids`)."""

    name = "processes"
    allow_key = "processes"
    mark = "last_pid"
    ends_by_itself = True
    finds_late = True

    def __init__(self) -> None:
        self.track_late = False  # the guard turns it on; a helper's block has no test
        #: The descendants the last snapshot or check saw (None before the first).
        self._seen: frozenset[int] | None = None
        #: node id -> processes that appeared after that test had ended (a launcher that
        #: daemonises after a delay, a fork-and-exit hopper).
        self._late: dict[str, set[int]] = {}

    def fingerprint(self) -> frozenset[int]:
        return descendant_pids()

    def snapshot(self) -> frozenset[int]:
        now = descendant_pids()
        self._note_late(now)
        return now

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[int]:
        if allow is True:
            return ()
        now = descendant_pids()
        if now and _subreaper_now():
            # Orphans the subreaper adopted that ended: reaped, no zombie piles up under pytest.
            reap_adopted(p for p in now if not process_running(p))
        late = self._note_late(now)
        if not now or now <= before:
            return ()
        fresh = now - before - late
        fresh -= multiprocessing_helper_pids(fresh)
        return tuple(sorted(p for p in fresh if process_running(p)))

    def _note_late(self, now: frozenset[int]) -> frozenset[int]:
        """Of the processes new since the last look, those whose environment names a test other
        than the running one (they left that test's tree after its check): kept for
        :meth:`late_items`, left out of the running test's items."""
        seen, self._seen = self._seen, now
        if not self.track_late or seen is None or now <= seen:
            return frozenset()
        current = origins.current_test()
        inherited = _own_initial_test()
        late = set()
        for pid in now - seen:
            test = _test_of(pid)
            if test == inherited:  # a fork without exec shows pytest's own initial block
                continue
            nodeid = test.rsplit(" (", 1)[0] if test else None
            if nodeid and nodeid != current and process_running(pid):
                self._late.setdefault(nodeid, set()).add(pid)
                late.add(pid)
        return frozenset(late)

    def late_items(self) -> dict[str, tuple[int, ...]]:
        """The processes found after their test ended, still running, by that test; each once."""
        late, self._late = self._late, {}
        found = {}
        for nodeid, pids in late.items():
            running = tuple(sorted(p for p in pids if process_running(p)))
            if running:
                found[nodeid] = running
        return found

    def targets(self, items: Sequence[int]) -> Mapping[Any, object]:
        from pytest_shutdown.ownership.owners import objects_of  # noqa: PLC0415

        return objects_of((), items, parent_pids(tuple(items)))

    def started_outside_tests(self, items: Sequence[int]) -> set[int]:
        """The child processes whose recorded start was outside any test."""
        between = origins.started_between_tests
        return {pid for pid in items if between(origins.origin_of_process(pid))}

    def still_there(self, items: Sequence[int]) -> list[int]:
        return [pid for pid in items if process_running(pid)]

    def settle(self, items: Sequence[int], deadline: float) -> Sequence[int]:
        return await_exit(Started((), tuple(items)), deadline - time.monotonic()).pids

    def findings(
        self, items: Sequence[int], subject: str, *, grace: float, extra: Extra = None
    ) -> list:  # type: ignore[type-arg]
        found = leak_findings(
            Started((), tuple(items)), grace=grace, subject=subject, extra=dict(extra or {})
        )
        for finding in found:
            for record in finding.details.get("processes", ()):
                describe_reparented(record)
                if not record.get("started_at"):  # said, never left out
                    record["started_at"] = UNKNOWN_SITE
        REPORTED.update(dict.fromkeys(items))
        while len(REPORTED) > 4096:
            del REPORTED[next(iter(REPORTED))]
        return found

    def restore(self, items: Sequence[int]) -> None:
        stop_processes(items, why="the guard restores order (fail mode)")

    def sweep_session_end(self, end: SessionEndContext) -> None:
        """Descendants started since the session began (however re-parented) that no module
        global owns are ``process-leak`` of the session; fail mode kills them."""
        now = descendant_pids()
        containment = end.containment
        if not containment.subreaper:  # re-parented ones are found by their marker
            now = now | frozenset(containment.stray_marked(now))
        if not now:
            return
        kept = set(end.session_start_pids) | set(multiprocessing_helper_pids(now))
        for name, item in [*end.long_lived, *end.reported_at_end]:
            # a global's pool (long-lived), or a leak just reported with its test: not again
            if name == self.name:
                kept.add(item)
                kept.update(_walk_descendants(item) or ())
        left = tuple(sorted(p for p in now - kept if process_running(p)))
        reap_adopted(now - set(left))
        if not left:
            return
        plain = [f.to_dict() for f in self.findings(left, "the session's tests", grace=0.0)]
        for finding in plain:
            procs = finding["details"].get("processes", [])
            described = ", ".join(process_label(r) for r in procs)
            count = len(procs)
            finding["message"] = (
                f"{count} process{'es' if count != 1 else ''} started by the session's tests "
                f"still running at session end: {described}"
                + ("; killed." if end.mode == "fail" else ".")
            )
        end.report.add_findings("<session end>", plain)
        if end.mode == "fail":
            stop_processes(left, why="the session-end sweep (fail mode)")
            # A fork-and-exit hopper may have hopped between the look and the kill: look again.
            for _ in range(_SWEEP_ROUNDS):
                again = frozenset(containment.stray_marked(kept)) - kept
                again = frozenset(p for p in again if process_running(p))
                if not again:
                    break
                stop_processes(sorted(again), why="the session-end sweep (fail mode)")


#: Seconds a leaked process pool has to stop through its own ``terminate()``.
POOL_STOP_S = 5.0


def stop_processes(pids: Sequence[int], *, why: str) -> list[dict[str, Any]]:
    """Stop the processes ``pids`` (fail mode): a live process pool's workers (multiprocessing's
    or a fork's, see :func:`pool_classes`) through the pool's own ``terminate()`` (killing a
    worker under a live pool leaves it re-spawning workers and its exit-time finalizer waiting
    forever on a lock the worker held), the others by the one tree killer. Returns the killed
    processes' records."""
    pids = tuple(pids)
    if not pids:
        return []
    stopped = _stop_pools_of(pids, why)
    rest = tuple(p for p in pids if p not in stopped)
    killed = kill_process_trees(rest, timeout=5.0, why=why) if rest else []
    reap_adopted([*rest, *(r["pid"] for r in killed)])
    return killed


def _stop_pools_of(pids: Sequence[int], why: str) -> set[int]:
    """Terminate each live process pool with a worker among ``pids`` (bounded); the workers so
    handed to their pool."""
    classes = pool_classes()
    wanted = set(pids)
    if not classes or not wanted:
        return set()
    import gc  # noqa: PLC0415

    handed: set[int] = set()
    pools: list[Any] = [o for o in gc.get_objects() if isinstance(o, classes)]
    for pool in pools:
        mine = [pid for w in list(getattr(pool, "_pool", ())) if (pid := _pid_of(w)) in wanted]
        if not mine:
            continue
        from pytest_shutdown._os.killer import record_ordered_end  # noqa: PLC0415

        record_ordered_end(mine, why + ": its pool's terminate()")
        stopper = threading.Thread(
            target=pool.terminate, name="pytest-shutdown-pool-stop", daemon=True
        )
        stopper.start()
        stopper.join(POOL_STOP_S)
        handed.update(mine)
    return handed


def pool_classes() -> tuple[type, ...]:
    """The loaded ``Pool`` classes of multiprocessing and of the forks of its code (billiard's,
    celery's; no subclass of multiprocessing's): the ``Pool`` of each loaded ``*.pool`` module
    that has a ``terminate()``."""
    found = []
    for name in modules_named("pool"):
        cls = getattr(sys.modules.get(name), "Pool", None)
        if isinstance(cls, type) and callable(getattr(cls, "terminate", None)):
            found.append(cls)
    return tuple(found)


def _pid_of(worker: object) -> int | None:
    """A pool worker's pid (its ``Process`` object's; a fork's workers are started by a
    ``Process`` class of its own, which no start record knows)."""
    try:
        pid = getattr(worker, "pid", None)
    except Exception:  # noqa: BLE001 - a closed Process raises ValueError
        return None
    return pid if type(pid) is int else None


#: How many times :func:`_test_of` reads an environment that reads empty.
_ENVIRON_TRIES = 5


def _test_of(pid: int) -> str | None:
    """:func:`started_in_test`, read again a few times while the environment reads empty: a
    process caught in the middle of an ``exec`` shows none for a moment."""
    env = escaped._read_environ(pid)
    for _ in range(_ENVIRON_TRIES - 1):
        if env != b"":
            break
        time.sleep(0.001)
        env = escaped._read_environ(pid)
    return _test_named_in(env)


@functools.lru_cache(maxsize=1)
def _own_initial_test() -> str | None:
    """This process's own ``PYTEST_CURRENT_TEST`` at exec: what a child forked without exec
    shows."""
    return started_in_test(os.getpid())


def describe_reparented(record: dict[str, Any]) -> None:
    """For a process no ``Popen``/``Process`` started (a daemon, a grandchild): whether it was
    re-parented, the test its environment names, where its first recorded ancestor started."""
    if record.get("started_at"):
        return
    pid = int(record["pid"])
    ppid = record.get("ppid")
    me = os.getpid()
    adopted = ppid == me and _subreaper_now() is True
    record["reparented"] = adopted or (
        ppid is not None and ppid != me and ppid not in descendant_pids()
    )
    record["adopted"] = adopted
    test = started_in_test(pid)
    if test is not None:
        record["started_in"] = test.rsplit(" (", 1)[0]
    ancestor = first_ancestor(pid, record.get("started_in"))
    if ancestor is not None:
        ancestor_pid, matched = ancestor
        origin = origins.origin_of_process(ancestor_pid)
        record["first_ancestor"] = {
            "pid": ancestor_pid,
            "matched_by": matched,
            "what": origin.what if origin is not None else None,
        }
        if origin is not None:
            record["started_at"] = (
                f"(its first recorded ancestor, pid {ancestor_pid}, {matched}:)\n"
                + origins.render_origin(origin)
            )
            record.setdefault("started_in", origin.test)


def parent_pids(pids: tuple[int, ...]) -> dict[int, int]:
    """pid -> parent pid, for the processes and their ancestors (to reach a Process object)."""
    if not pids:
        return {}
    import psutil  # noqa: PLC0415 - only when a child process is alive

    parents: dict[int, int] = {}
    for pid in pids:
        current = pid
        for _ in range(16):
            try:
                parent = psutil.Process(current).ppid()
            except psutil.Error:
                break
            parents[current] = parent
            current = parent
            if parent in parents or parent <= 1:
                break
    return parents
