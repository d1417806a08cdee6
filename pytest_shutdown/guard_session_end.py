"""The guard at the session's end, and the late leaks it reports on the way.

- Late leaks: what a kind found after the test that made it had ended (a launcher that
  daemonises after a delay), reported at the next set-up and at session end
  (:meth:`SessionEnd._report_late`).
- The long-lived resources (a module global's pool, a library's monitor thread) still alive
  are listed; ``--shutdown-long-lived=fail`` fails the session with them.
- The kinds' session-end hooks (:meth:`SessionEnd._end_the_kinds`), every kind in order: the
  sweep, nothing a test started may remain (``sweep_session_end``); then what the tests left
  that would block the interpreter's exit (``blocking_exit``): fail mode bounds the exit's
  wait for it (``pytest_unconfigure``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.guard_state import GuardState
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources import session_end_kinds
from pytest_shutdown.resources.base import SessionEndContext


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
        self._end_the_kinds()
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

    def _end_the_kinds(self) -> None:
        """Every kind's session-end hooks, in order, given the session's data (not the guard):
        first the sweep of what the session's tests left (not on the xdist controller: its
        workers sweep their own), then what would block the interpreter's exit (kept for fail
        mode's bound, ``pytest_unconfigure``)."""
        end = SessionEndContext(
            mode=self.settings.mode,
            grace_s=self.settings.grace_s,
            report=self.report,
            session_start_pids=self._session_start_pids,
            session_start_threads=self._session_start_threads,
            containment=self.containment,
            long_lived=tuple(self._long_lived),
            reported_at_end=self._reported_at_end,
        )
        kinds = session_end_kinds(self.kinds, settings=self.settings)
        if not self.config.pluginmanager.hasplugin("dsession"):
            for kind in kinds:
                kind.sweep_session_end(end)
        for kind in kinds:
            self._blocking_exit.extend(kind.blocking_exit(end))

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
