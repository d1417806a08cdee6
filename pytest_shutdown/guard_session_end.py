"""The guard at the session's end, and the late leaks it reports on the way.

- Late leaks: what a kind found after the test that made it had ended (a launcher that
  daemonises after a delay), reported at the next set-up and at session end
  (:meth:`SessionEnd._report_late`).
- The long-lived resources (a module global's pool, a library's monitor thread) still alive
  are listed; ``--shutdown-long-lived=fail`` fails the session with them.
- The sweep: nothing a test started may remain (:meth:`SessionEnd._sweep_session`); the
  non-daemon threads tests left would block the interpreter's exit
  (:meth:`SessionEnd._note_threads_blocking_exit`): fail mode bounds it (``pytest_unconfigure``).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.guard_state import GuardState
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources.primitives import Started, descendant_pids

#: Extra looks of the fail-mode session-end sweep for a process that hopped (forked and
#: exited) between the look and the kill.
_SWEEP_ROUNDS = 5


class SessionEnd(GuardState):
    """Late leaks, the long-lived list, the session-end sweep and the exit."""

    _exitstatus = 0
    _late_failures = 0
    #: Warn mode: ``(kind name, item)`` of the last tests' leaks reported at session end.
    _reported_at_end: AbstractSet[tuple[str, Any]] = frozenset()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """List the long-lived resources still alive; with ``--shutdown-long-lived=fail`` (on
        the controller, after the workers' lists are merged) they fail the session. Warn
        mode's pending candidates are confirmed first, with no wait (see pending.py)."""
        if self._deferred is not None and len(self._deferred):
            self._reported_at_end = self._deferred.confirm_all()
        late_finders = [k for k in self._objects if k.finds_late]
        if late_finders:  # what left the last tests' trees after their checks
            self._snapshot(late_finders)
            self._report_late()
        now = time.monotonic()
        by_kind: dict[str, list[Any]] = {}
        for name, item in self._long_lived:
            by_kind.setdefault(name, []).append(item)
        alive: set[tuple[str, Any]] = set()
        for name, items in by_kind.items():  # one settle per kind: one collection, not one each
            kind = self._by_name.get(name)
            if kind is None:
                continue
            thorough = self.settings.long_lived == "fail"  # else listed only: no whole-heap gc
            left = kind.settle_long_lived(tuple(items), now, thorough=thorough)
            alive.update((name, item) for item in left)
        for key, record in self._long_lived.items():
            if key in alive:
                self.report.add_long_lived(record)
        self._sweep_session()
        self._note_threads_blocking_exit()
        self._exitstatus = int(session.exitstatus)
        self._long_lived.clear()
        if self._late_failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a late leak found in fail mode
        if hasattr(self.config, "workerinput"):
            return
        if self.settings.long_lived == "fail" and self.report.long_lived:
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        origins.uninstall()
        origins.set_current_test(None)
        self.containment.release()
        for kind in self.kinds:  # a kind that installed something (a recorder) removes it
            kind.close()
        if self._blocking_exit and self.settings.mode == "fail":
            # The report and the record log are written (the report plugin's sessionfinish).
            from pytest_shutdown.exit_bound import bound_the_exit  # noqa: PLC0415

            bound_the_exit(self._blocking_exit, self.settings.grace_s, self._exitstatus)

    def _note_threads_blocking_exit(self) -> None:
        """Non-daemon threads tests leaked (reported as ``thread-leak``) still alive block the
        interpreter's exit (``threading._shutdown`` joins them): say so; fail mode bounds it."""
        from pytest_shutdown.resources.primitives import leak_findings  # noqa: PLC0415

        kind = self._by_name.get("threads")
        tools = getattr(kind, "tools", None)
        from pytest_shutdown.resources.threads import REPORTED  # noqa: PLC0415

        blocking = [
            t
            for t in list(REPORTED)  # a test's leak, not a global's pool (listed as long-lived)
            if t not in self._session_start_threads
            and not t.daemon
            and t.is_alive()
            and t is not threading.current_thread()
            and not isinstance(t, threading._DummyThread)
            and not (tools is not None and tools(t))
        ]
        if not blocking:
            return
        self._blocking_exit = blocking
        findings = leak_findings(Started(tuple(blocking)), grace=0.0, subject="the session")
        plain = [f.to_dict() for f in findings]
        if self.settings.mode == "warn":  # the report says so until the exit is unblocked
            records = [r for f in plain for r in f["details"].get("threads", [])]
            self.report.exit_blocked(
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
                    f"the exit waits at most the {self.settings.grace_s:g} s grace for "
                    "them instead of hanging."
                    if self.settings.mode == "fail"
                    else "the interpreter's exit will wait for them (forever if they never end)."
                )
            )
        self.report.add_findings("<session end>", plain)

    def _sweep_session(self) -> None:
        """At session end, nothing a test started may remain: descendants started since the
        session began (found however they were re-parented) that no module global owns are
        listed as ``process-leak`` of the session; fail mode kills them. Adopted zombies are
        reaped. Not on the xdist controller (its workers sweep their own)."""
        if self.config.pluginmanager.hasplugin("dsession"):
            return
        from pytest_shutdown.ownership.containment import reap_adopted  # noqa: PLC0415
        from pytest_shutdown.resources.primitives import (  # noqa: PLC0415
            _walk_descendants,
            multiprocessing_helper_pids,
            process_running,
        )
        from pytest_shutdown.resources.processes import (  # noqa: PLC0415
            ProcessKind,
            stop_processes,
        )

        now = descendant_pids()
        if not self.containment.subreaper:  # re-parented ones are found by their marker
            now = now | frozenset(self.containment.stray_marked(now))
        if not now:
            return
        kept = set(self._session_start_pids) | set(multiprocessing_helper_pids())
        for name, item in [*self._long_lived, *self._reported_at_end]:
            # a global's pool, listed as long-lived, or a test's leak just reported with its
            # test (warn mode, pending.py): not listed again
            if name == "processes":
                kept.add(item)
                kept.update(_walk_descendants(item) or ())
        left = tuple(sorted(p for p in now - kept if process_running(p)))
        reap_adopted(now - set(left))
        if not left:
            return
        findings = ProcessKind().findings(left, "the session's tests", grace=0.0)
        plain = [f.to_dict() for f in findings]
        for finding in plain:
            procs = finding["details"].get("processes", [])
            described = ", ".join(f"{r['pid']} ({r['name'] or '?'})" for r in procs)
            count = len(procs)
            finding["message"] = (
                f"{count} process{'es' if count != 1 else ''} started by the session's tests "
                f"still running at session end: {described}"
                + ("; killed." if self.settings.mode == "fail" else ".")
            )
        self.report.add_findings("<session end>", plain)
        if self.settings.mode == "fail":
            stop_processes(left, why="the session-end sweep (fail mode)")
            # A fork-and-exit hopper may have hopped between the look and the kill: look again
            # (a few rounds, each one pass), and stop what still carries the marker.
            for _ in range(_SWEEP_ROUNDS):
                again = frozenset(self.containment.stray_marked(kept)) - kept
                again = frozenset(p for p in again if process_running(p))
                if not again:
                    break
                stop_processes(sorted(again), why="the session-end sweep (fail mode)")

    def _report_late(self) -> None:
        """Report what the kinds found after the test that made it had ended (a launcher that
        daemonises after a delay): a record for that test, a warning in warn mode; fail mode
        stops it and the session fails."""
        for kind in self._objects:
            if not kind.finds_late:
                continue
            for nodeid, items in kind.late_items().items():
                if kind.name in self._allowed_late.get(nodeid, ()):
                    continue  # its test allowed such leaks
                name = nodeid.rpartition("::")[2] or nodeid
                plain = [
                    f.to_dict()
                    for f in kind.findings(items, name, grace=0.0, extra={"found_late": True})
                ]
                for finding in plain:
                    finding["message"] = finding["message"].replace(
                        "(no grace was given)", "after the test had ended"
                    ) + (
                        " It left the test's tree later and was found by the test's name in its"
                        " environment" + ("; stopped." if self.settings.mode == "fail" else ".")
                    )
                self.report.add_findings(nodeid, plain)
                if self.settings.mode == "fail":
                    kind.restore(items)
                    self._late_failures += 1
                else:
                    warnings.warn(
                        ShutdownLeakWarning(f"leaked by {nodeid}: " + self._render(plain)),
                        stacklevel=1,
                    )
