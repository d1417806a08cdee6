"""asyncio: tasks left pending, loops never closed, async generators never finalized, coroutines
never awaited (``task-leak``, ``loop-left``, ``asyncgen-left``, ``coroutine-never-awaited``).

What the test made is known from :mod:`pytest_shutdown.resources._asyncio_record` (wrappers that
only record; asyncio is not imported for it). The kind's fingerprint is that record's counter:
one integer read, whatever the test did, and it moves only when a loop, a task, an async
generator or an event was recorded. The items, all made during the test (its set-up, call and
teardown; what a wider-scope fixture's set-up made is that fixture's, as for threads):

* ``task-leak``: a task still pending when the test ended, on a loop the test created or on the
  thread the tests run in (a loop the test ran: pytest-asyncio's module or session loop); or a
  task still pending when its loop's runner shut down (``asyncio.run``, ``Runner.close``, the
  pytest-asyncio and anyio loop fixtures), which then cancelled it: nothing that started it
  awaited or cancelled it (not when a ``KeyboardInterrupt``, ``SystemExit`` or the like
  interrupted the run: what was pending was cut short); or a task collected while pending
  ("Task was destroyed but it is pending!"). Named by its coroutine, with the call site of
  ``create_task`` and where it waits now.
* ``loop-left``: a loop the test created and never closed with ``close()``: still open after
  the test, or collected unclosed (its ``__del__`` closed it, with a ``ResourceWarning``).
* ``asyncgen-left``: an async generator first iterated on a loop during the test that can never
  be finalized: its loop was closed before its ``aclose()`` ran (no
  ``loop.shutdown_asyncgens()`` before ``loop.close()``); still suspended after the test, or
  collected after the close (asyncio then raises "Event loop is closed" in the collector).
* ``coroutine-never-awaited``: CPython's ``RuntimeWarning: coroutine ... was never awaited``,
  issued during the test; the warning itself is left to the user's filters, unchanged.

Ownership is the guard's, as for threads: a task, loop or generator a wider-scope fixture's
value or a module global reaches is not the test's (the ownership search does not walk through
event loops, handles and futures: a loop references everything scheduled on it, and owns none
of it). Fail mode closes the test's own loops that are not running (their selector and
self-pipe); it never cancels a task. Warn mode changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources import _asyncio_record as record
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind, after_grace

__all__ = ["AsyncioKind", "Baseline", "left_since", "task_findings"]

#: A snapshot: the record's counter, and the ranges ``(start, end]`` of it that wider-scope
#: fixtures' set-ups made (theirs, not the test's).
Baseline = tuple[int, tuple[tuple[int, int], ...]]

_CODES = {
    "task": "task-leak",
    "cancelled-by-runner": "task-leak",
    "destroyed-pending": "task-leak",
    "loop": "loop-left",
    "collected-unclosed": "loop-left",
    "asyncgen": "asyncgen-left",
    "finalized-after-close": "asyncgen-left",
    "never-awaited": "coroutine-never-awaited",
}


def _excluded(number: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(start < number <= end for start, end in ranges)


def _pending_task(entry: record.Entry, start: int, on_any_loop: bool) -> bool:
    """A task made after ``start`` still pending, on a loop made since or on the tests' thread,
    or with ``on_any_loop`` on any loop (not the tool's own runner task)."""
    task = entry.obj()
    if task is None or task.done() or record._is_tool(entry):
        return False
    return on_any_loop or entry.loop_seq > start or entry.thread == record.main_thread_ident()


def _open_loop(entry: record.Entry) -> bool:
    loop = entry.obj()
    return loop is not None and not entry.closed and not loop.is_closed()


def _stuck_agen(entry: record.Entry) -> bool:
    """Suspended, and its loop closed: its ``aclose()`` can never run there."""
    agen = entry.obj()
    if agen is None or getattr(agen, "ag_frame", None) is None:
        return False
    loop_entry = record._live.get(entry.loop_seq)
    loop = loop_entry.obj() if loop_entry is not None else None
    return loop is not None and loop.is_closed()


def left_since(
    before: Baseline, *, in_tests_only: bool = True, on_any_loop: bool = False
) -> list[record.Entry]:
    """What was made after ``before`` and is left now (see the module docstring), the
    wider-scope fixtures' ranges excluded; with ``in_tests_only``, what was made between tests
    (no test running: a background thread's) is no test's; with ``on_any_loop``, a task is
    counted whatever its loop (a block's check: it made the task, on an older loop too)."""
    start, ranges = before
    if record.seq() == start:
        return []
    found: list[record.Entry] = []
    for entry in record.entries_since(start):
        if _excluded(entry.seq, ranges) or (in_tests_only and entry.test is None):
            continue
        if entry.what == "task":
            keep = _pending_task(entry, start, on_any_loop)
        elif entry.what == "loop":
            keep = _open_loop(entry)
        else:
            keep = _stuck_agen(entry)
        if keep:
            found.append(entry)
    found.reverse()
    for event in record.events_since(start):
        made_before = 0 < event.seq <= start  # (0: made before it was recorded)
        if made_before or _excluded(event.seq or event.event_seq, ranges):
            continue
        if in_tests_only and event.test is None and event.detail.get("event_test") is None:
            continue
        found.append(event)
    return found


class AsyncioKind(ObjectKind):
    """asyncio's loops, tasks, async generators and unawaited coroutines (see the module)."""

    name = "asyncio"
    allow_key = "asyncio"
    #: The fingerprint is one integer read, shared with no other kind.
    reads_alone = True

    def __init__(self) -> None:
        record.install()  # for the guard's session; asyncio itself is not imported

    def close(self) -> None:
        record.uninstall()

    def fingerprint(self) -> int:
        return record._seq

    def snapshot(self) -> Baseline:
        return (record._seq, ())

    def absorb(self, before: Baseline, start: Baseline, end: Baseline | None) -> Baseline:
        """What a wider-scope fixture's set-up made (between ``start`` and ``end``, now when
        None: the guard snapshots only the state kinds then) is that fixture's."""
        last = record.seq() if end is None else end[0]
        if start is None or last <= start[0]:
            return before
        return (before[0], (*before[1], (start[0], last)))

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[record.Entry]:
        if allow is True:
            return ()
        found = left_since(before)
        if isinstance(allow, tuple):
            from fnmatch import fnmatchcase  # noqa: PLC0415 - only with patterns

            found = [e for e in found if not any(fnmatchcase(e.name, p) for p in allow)]
        return tuple(found)

    def targets(self, items: Sequence[record.Entry]) -> Mapping[Any, object]:
        found: dict[Any, object] = {}
        for entry in items:
            obj = entry.obj() if entry.event is None else None
            if obj is not None:
                found[entry] = obj
        return found

    def settle(self, items: Sequence[record.Entry], deadline: float) -> Sequence[record.Entry]:
        """Waits only for what can still end by itself: a task or a loop whose loop runs in
        another thread (short polls until ``deadline``)."""
        left = list(items)
        delay = 0.005
        while True:
            left = [e for e in left if _still_left(e)]
            if not any(_running_elsewhere(e) for e in left) or time.monotonic() >= deadline:
                return left
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    def already_over(self, items: Sequence[record.Entry]) -> Sequence[record.Entry]:
        """The events (a task a runner cancelled or collected pending, a loop collected
        unclosed, a generator finalized after its loop closed, a coroutine never awaited) and
        the tasks that ended so since the test: nothing can undo them."""
        return [e for e in items if e.event is not None or e.seq in record.ended_by]

    def findings(
        self, items: Sequence[record.Entry], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        return [_finding(entry, subject, grace, dict(extra or {})) for entry in items]

    def restore(self, items: Sequence[record.Entry]) -> None:
        """Fail mode: close the test's own loops that are not running (never a task)."""
        for entry in items:
            loop = entry.obj() if entry.what == "loop" and entry.event is None else None
            if loop is not None and not loop.is_running() and not loop.is_closed():
                try:
                    loop.close()
                except Exception:  # noqa: BLE001 - restoring must never break the run
                    pass


def _loop_of(entry: record.Entry) -> Any:
    obj = entry.obj()
    if entry.what == "loop":
        return obj
    get_loop = getattr(obj, "get_loop", None)
    return get_loop() if get_loop is not None else None


def _running_elsewhere(entry: record.Entry) -> bool:
    if entry.event is not None:
        return False
    loop = _loop_of(entry)
    return loop is not None and loop.is_running()


def _still_left(entry: record.Entry) -> bool:
    if entry.event is not None:
        return True
    if entry.what == "task":  # (a runner cancelled it, or it was collected pending: left)
        task = entry.obj()
        return (task is not None and not task.done()) or entry.seq in record.ended_by
    if entry.what == "loop":  # open when the test ended: left unless a close() came since
        return not entry.closed  # (a collection closes it in its __del__: not a close())
    return True


def _where(site: tuple[tuple[str, int, str], ...]) -> str:
    if not site:
        return "an unknown site"
    filename, lineno, name = site[0]
    return f"{filename}:{lineno} in {name}"


def _finding(entry: record.Entry, subject: str, grace: float, extra: dict[str, Any]) -> Finding:
    state = entry.event or entry.what
    if state == "task" and entry.seq in record.ended_by:  # pending at the end: then ended so
        state = record.ended_by[entry.seq]
    code = _CODES[state]
    details: dict[str, Any] = {
        "what": entry.what,
        "name": entry.name,
        "state": state,
        "created_at": _where(entry.site) if entry.site else None,
        "stack": [f"{f}:{line} in {fn}" for f, line, fn in entry.site],
        "started_in": entry.test,
        **{k: v for k, v in entry.detail.items() if v is not None},
        **extra,
    }
    site = _where(entry.site)
    if state == "task":
        task = entry.obj()
        coro = task.get_coro() if task is not None else None
        details["waiting_at"] = record._frame_of(coro) if coro is not None else None
        waiting = f", waiting at {details['waiting_at']}" if details["waiting_at"] else ""
        message = (
            f"task running {entry.name} created in {subject} at {site} is still pending "
            f"{after_grace(grace)}{waiting}: nothing awaited or cancelled it."
        )
    elif state == "cancelled-by-runner":
        message = (
            f"task running {entry.name} created in {subject} at {site} was still pending when "
            "its event loop's runner shut down (asyncio.run, Runner.close or the loop fixture's "
            "teardown cancelled it): nothing that started it awaited or cancelled it."
        )
    elif state == "destroyed-pending":
        message = (
            f"task running {entry.name} created in {subject} at {site} was garbage-collected "
            "while still pending (asyncio: 'Task was destroyed but it is pending!'): nothing "
            "awaited or cancelled it, and now nothing ever will."
        )
    elif state == "loop":
        message = (
            f"event loop {entry.name} created in {subject} at {site} was never closed "
            f"(still open {after_grace(grace)}): call loop.close(), or use asyncio.run / "
            "asyncio.Runner."
        )
    elif state == "collected-unclosed":
        message = (
            f"event loop {entry.name} created in {subject} at {site} was never closed: it was "
            "garbage-collected open (its __del__ closed it, with a ResourceWarning)."
        )
    elif state in ("asyncgen", "finalized-after-close"):
        how = (
            "it is still suspended and its loop is closed"
            if state == "asyncgen"
            else "it was collected after its loop closed (asyncio's finalizer hook then raises "
            "'Event loop is closed')"
        )
        message = (
            f"async generator {entry.name} first iterated in {subject} at {site} was never "
            f"finalized: {how}; run loop.shutdown_asyncgens() before loop.close(), or aclose() it."
        )
    else:  # never-awaited
        where = (
            f" (defined at {entry.detail['defined_at']})" if entry.detail.get("defined_at") else ""
        )
        message = (
            f"coroutine {entry.name}{where} was never awaited in {subject}: it was dropped at "
            f"{site} (RuntimeWarning: coroutine ... was never awaited)."
        )
    return Finding(code, message, details)


def task_findings(entries: Sequence[record.Entry], subject: str, grace: float) -> list[Finding]:
    """The ``task-leak`` findings of ``entries`` (for :func:`pytest_shutdown.no_task_leaks`)."""
    return [_finding(e, subject, grace, {}) for e in entries]
