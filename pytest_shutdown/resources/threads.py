"""Threads: ``threading.Thread`` objects a test started and left running (``thread-leak``)."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.ownership import origins
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind, SessionEndContext
from pytest_shutdown.resources.primitives import (
    Started,
    ThreadFilter,
    await_exit,
    leak_findings,
    thread_filter,
    thread_name,
)

__all__ = ["REPORTED", "TOOL_MODULES", "ThreadKind", "is_tool_thread"]

#: Threads reported as ``thread-leak``: the session end looks at them (see blocking_exit).
REPORTED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

#: Top-level modules whose threads belong to the test tools, never to the code under test.
TOOL_MODULES = frozenset({"execnet", "xdist", "pytest_timeout", "_pytest", "pluggy"})


def is_tool_thread(thread: threading.Thread) -> bool:
    """True for the test tools' own threads (pytest-timeout's timer, execnet I/O threads)."""
    if thread_name(thread).startswith("pytest_timeout "):
        return True
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) or type(thread).__module__ or ""
    return module.partition(".")[0] in TOOL_MODULES


def _alive_or_starting(thread: threading.Thread) -> bool:
    """Alive, or started and not yet running (in ``threading._limbo``, ``is_alive()`` still
    False: a busy GIL can keep it there past the end of its test)."""
    if thread.is_alive():
        return True
    limbo = getattr(threading, "_limbo", None) or {}
    return thread in limbo and not getattr(thread, "_is_stopped", False)


class ThreadKind(ObjectKind):
    """Python threads (those ``threading`` lists), compared by identity (idents are reused).
    ``tools`` says which threads are the test tools' own: never reported, nor the standard
    library's process-lifetime helper threads."""

    name = "threads"
    allow_key = "threads"
    mark = "threads"
    ends_by_itself = True

    def __init__(self, tools: ThreadFilter | None = None) -> None:
        self.tools: ThreadFilter = tools or thread_filter([is_tool_thread])

    def fingerprint(self) -> list[threading.Thread]:
        return threading.enumerate()  # the same threads in the same order: nothing new

    def snapshot(self) -> frozenset[threading.Thread]:
        return frozenset(threading.enumerate())

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[threading.Thread]:
        if allow is True:
            return ()
        now = threading.enumerate()
        if not isinstance(before, (set, frozenset)):
            before = frozenset(before)
        if before.issuperset(now):
            return ()  # nothing new: the common case, no filter compiled
        filt = thread_filter([self.tools, *allow]) if isinstance(allow, tuple) else self.tools
        current = threading.current_thread()
        found = tuple(
            t
            for t in now
            if t not in before
            and t is not current
            and _alive_or_starting(t)
            and not isinstance(t, threading._DummyThread)
            and not filt(t)
        )
        if not found:
            return found
        from pytest_shutdown.ownership.owners import stdlib_helper_threads  # noqa: PLC0415 - when found

        helpers = stdlib_helper_threads()
        return tuple(t for t in found if t not in helpers)

    def targets(self, items: Sequence[threading.Thread]) -> Mapping[Any, object]:
        return {thread: thread for thread in items}

    def started_outside_tests(self, items: Sequence[threading.Thread]) -> set[threading.Thread]:
        """The threads whose recorded start was outside any test."""
        return {t for t in items if origins.started_between_tests(origins.origin_of_thread(t))}

    def still_there(self, items: Sequence[threading.Thread]) -> list[threading.Thread]:
        return [thread for thread in items if _alive_or_starting(thread)]

    def settle(self, items: Sequence[threading.Thread], deadline: float) -> Sequence[Any]:
        return await_exit(Started(tuple(items)), deadline - time.monotonic()).threads

    def findings(
        self, items: Sequence[threading.Thread], subject: str, *, grace: float, extra: Extra = None
    ) -> list:  # type: ignore[type-arg]
        REPORTED.update(items)
        return leak_findings(
            Started(tuple(items)), grace=grace, subject=subject, extra=dict(extra or {})
        )

    def blocking_exit(self, end: SessionEndContext) -> list[threading.Thread]:
        """Non-daemon threads the tests leaked (reported) and still alive: the interpreter's exit
        joins them."""
        blocking = [
            t
            for t in list(REPORTED)  # a test's leak, not a global's pool (listed as long-lived)
            if t not in end.session_start_threads
            and not t.daemon
            and t.is_alive()
            and t is not threading.current_thread()
            and not isinstance(t, threading._DummyThread)
            and not self.tools(t)
        ]
        if not blocking:
            return blocking
        findings = leak_findings(Started(tuple(blocking)), grace=0.0, subject="the session")
        plain = [f.to_dict() for f in findings]
        if end.mode == "warn":  # the report says so until the exit is unblocked
            records = [r for f in plain for r in f["details"].get("threads", [])]
            end.report.exit_blocked(
                blocking,
                [
                    {k: r.get(k) for k in ("name", "ident", "started_in", "started_at")}
                    for r in records
                ],
            )
        for finding in plain:
            names = ", ".join(repr(t.name) for t in blocking)
            finding["message"] = (
                f"{len(blocking)} non-daemon thread{'s' if len(blocking) != 1 else ''} started "
                f"by the session's tests still running at session end: {names}; "
                + (
                    f"the exit waits at most the {end.grace_s:g} s grace for "
                    "them instead of hanging."
                    if end.mode == "fail"
                    else "the interpreter's exit will wait for them (forever if they never end)."
                )
            )
        end.report.add_findings("<session end>", plain)
        return blocking
