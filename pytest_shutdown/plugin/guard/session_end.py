"""The guard at the session's end: late leaks (found after their test ended, also reported at
the next set-up), the long-lived resources still alive, the kinds' sweep, and the bound on the
exit's wait for what tests left (fail mode).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
from pytest_shutdown.ownership import origins
from pytest_shutdown.plugin.guard.state import GuardState
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
        """List the long-lived resources still alive (``--shutdown-long-lived=fail``: they fail
        the session, on the controller); warn mode's candidates are confirmed first."""
        if self._deferred is not None and len(self._deferred):
            self._reported_at_end = self._deferred.confirm_all()
        late_finders = [k for k in self._objects if k.finds_late]
        if late_finders:
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
        fails = self._late_failures or (  # the controller has the workers' long-lived lists
            self.settings.long_lived == "fail"
            and self.report.long_lived
            and not hasattr(self.config, "workerinput")
        )
        if fails and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        origins.uninstall()
        origins.set_current_test(None)
        self.containment.release()
        for kind in self.kinds:  # a kind that installed something (a recorder) removes it
            kind.close()
        if self._blocking_exit and self.settings.mode == "fail":
            from pytest_shutdown.plugin.exit_bound import bound_the_exit  # noqa: PLC0415

            bound_the_exit(self._blocking_exit, self.settings.grace_s, self._exitstatus)

    def _end_the_kinds(self) -> None:
        """Every kind's sweep (not on the xdist controller), then what would block the exit."""
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
        """Report what the kinds found after its test ended (a launcher that daemonises after
        a delay): a record, a warning in warn mode; fail mode stops it and fails the session."""
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
