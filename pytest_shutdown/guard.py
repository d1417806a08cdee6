"""The guard: per-test and per-fixture accounting of threads, child processes and gc freezes.

For every test (setup, call and teardown together) the guard takes a snapshot before setup and
compares after teardown, using the primitives of :mod:`pytest_shutdown.checks.leaks`. Whose leak
is it (:mod:`pytest_shutdown.ownership`, decided before any grace is waited): threads and
processes started while a fixture of wider scope was being set up, or that its value reaches,
belong to that fixture; they are checked, and blamed on it, when that fixture is torn down.
Those a module global or class attribute reaches are never a test's leak; the ones still alive
at session end are listed as long-lived resources. The standard library's process-lifetime
helpers and the tools' own threads (pytest-timeout's timer, execnet/xdist, pytest,
pytest-shutdown's watchdogs) are never blamed. Creation sites come from
:mod:`pytest_shutdown.origins`.

Findings become a :class:`~pytest_shutdown.report.TestRecord` and ``user_properties``; in
``fail`` mode the test errors in teardown with :class:`ShutdownContractError`, in ``warn`` mode a
:class:`ShutdownLeakWarning` is emitted; a test that already failed gets them as a report section
of its failure instead, without a grace wait. In ``fail`` mode only, the guard then restores
order for the next test: the test's own leaked process trees are killed and a gc freeze left
behind is undone (when there was none before). Warn mode changes nothing in the run. Leaked
threads, now part of the next baseline, are not blamed again.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
import types
import warnings
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_shutdown import origins
from pytest_shutdown.checks.leaks import (
    LeakSnapshot,
    Started,
    ThreadFilter,
    await_exit,
    kill_process_trees,
    leak_findings,
    process_running,
    started_since,
    take_snapshot,
    thread_filter,
    thread_name,
)
from pytest_shutdown.checks.process_groups import group_names, process_group_findings
from pytest_shutdown.findings import Finding, ShutdownContractError
from pytest_shutdown.ownership import Owner, find_owners, objects_of, stdlib_helper_threads
from pytest_shutdown.report import (
    ShutdownReport,
    TestRecord,
    describe_guard_error,
    render_budget,
    render_findings,
)
from pytest_shutdown.settings import (
    AllowLeaks,
    GuardSettings,
    allow_leaks_of,
    budget_of,
    shows_details,
)

__all__ = ["ShutdownGuard", "ShutdownLeakWarning"]


class ShutdownLeakWarning(pytest.PytestWarning):
    """Emitted by ``pytest -p shutdown --shutdown-guard=warn`` for each test that leaked."""


#: Top-level modules whose threads belong to the test tools, never to the code under test.
TOOL_MODULES = frozenset({"execnet", "xdist", "pytest_timeout", "_pytest", "pluggy"})

_ALLOW_KEY = pytest.StashKey["AllowLeaks | None"]()
_BUDGET_KEY = pytest.StashKey[float]()
_MARKER_ERROR_KEY = pytest.StashKey[str]()

_PYTEST_TIMEOUT_MARK = "from pytest-timeout"
_GUARD_ATTR = "_pytest_shutdown_findings"
_GUARD_ERROR_TITLE = "shutdown guard"
#: The report section that carries the guard's findings of a test that already failed.
GUARD_SECTION = "Captured shutdown guard teardown"


def is_tool_thread(thread: threading.Thread) -> bool:
    """True for the test tools' own threads (pytest-timeout's timer, execnet I/O threads)."""
    if thread_name(thread).startswith("pytest_timeout "):
        return True
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) or type(thread).__module__ or ""
    return module.partition(".")[0] in TOOL_MODULES


def _is_pytest_timeout(exc: BaseException | None) -> bool:
    return exc is not None and _PYTEST_TIMEOUT_MARK in str(exc)


@dataclass
class _Owned:
    """Threads and processes a wider-scope fixture started during its setup."""

    fixture: str
    scope: str
    baseid: str
    started: Started
    freeze_before_setup: int
    freeze_at_teardown: int | None = None

    def teardown_started(self) -> None:
        self.freeze_at_teardown = gc.get_freeze_count()

    def owner(self) -> dict[str, str]:
        return {"fixture": self.fixture, "scope": self.scope, "baseid": self.baseid}

    def adopt(self, threads: tuple[threading.Thread, ...], pids: tuple[int, ...]) -> None:
        """Threads and processes a test started that this fixture's value reaches: checked,
        and blamed on the fixture, at its teardown."""
        self.started = Started(self.started.threads + threads, self.started.pids + pids)


@dataclass
class _Watch:
    """The guard's state for the test being run."""

    item: pytest.Item
    before: LeakSnapshot
    allow: AllowLeaks | None
    budget_s: float
    excluded: set[Any] = field(default_factory=set)
    freeze_adjust: int = 0
    finished: list[tuple[_Owned, int]] = field(default_factory=list)
    timed_out: bool = False
    failed: bool = False
    #: The torch.distributed process groups initialised before the test (usually none).
    groups_before: frozenset[str] = frozenset()


class ShutdownGuard:
    """The pytest plugin object registered when the guard is on (by the plugin module)."""

    def __init__(
        self, config: pytest.Config, settings: GuardSettings, report: ShutdownReport
    ) -> None:
        self.config = config
        self.settings = settings
        self.report = report
        self.tools: ThreadFilter = thread_filter([is_tool_thread])
        self._watch: _Watch | None = None
        self._owned: dict[Any, _Owned] = {}
        #: Threads and pids owned by a module global or class attribute -> what the report says.
        self._long_lived: dict[Any, dict[str, Any]] = {}
        #: Failed setup/call reports by node id, to attach the teardown's findings to.
        self._failed_reports: dict[str, pytest.TestReport] = {}
        origins.install()

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        origins.uninstall()
        origins.set_current_test(None)

    # --- collection: markers are validated once, here ---

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Validate the markers: a bad one is a usage error (exit code 4). On an xdist worker,
        where a usage error would only crash the worker, the test errors in setup instead."""
        on_worker = hasattr(self.config, "workerinput")
        for item in items:
            try:
                item.stash[_ALLOW_KEY] = allow_leaks_of(item)
                item.stash[_BUDGET_KEY] = budget_of(item, self.settings.budget_s)
            except pytest.UsageError as exc:
                if not on_worker:
                    raise
                item.stash[_MARKER_ERROR_KEY] = str(exc)

    # --- the test ---

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, object, object]:
        allow = item.stash.get(_ALLOW_KEY, None)
        budget = item.stash.get(_BUDGET_KEY, self.settings.budget_s)
        self._watch = _Watch(item, take_snapshot(), allow, budget, groups_before=group_names())
        origins.set_current_test(item.nodeid)
        result = yield
        marker_error = item.stash.get(_MARKER_ERROR_KEY, None)
        if marker_error is not None:  # after setup, so that teardown finds a consistent state
            pytest.fail(marker_error, pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        watch = self._watch
        if call.excinfo is None:
            return report
        if watch is not None and watch.item is item and call.when != "teardown" and report.failed:
            watch.failed = True
        if watch is not None and _is_pytest_timeout(call.excinfo.value):
            watch.timed_out = True
        plain = getattr(call.excinfo.value, _GUARD_ATTR, None)
        if call.when == "teardown" and plain is not None:
            # The guard's own error: show the findings, not the guard's source.
            codes = ", ".join(dict.fromkeys(f["code"] for f in plain))
            report.longrepr = f"{_GUARD_ERROR_TITLE}: {codes}\n{self._render(plain)}"
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        watch = self._watch
        if watch is None or watch.item is not item:
            return (yield)
        start = time.monotonic()
        budget = None
        if watch.budget_s > 0:
            from pytest_shutdown.budget import TeardownBudget  # noqa: PLC0415 - only with a budget

            budget = TeardownBudget(
                watch.budget_s, item.nodeid, on_expire=lambda: self._kill_children(watch)
            )
        error: BaseException | None = None
        result: object = None
        try:
            with budget if budget is not None else contextlib.nullcontext():
                result = yield
        except (KeyboardInterrupt, SystemExit, pytest.exit.Exception):
            self._watch = None
            raise
        except BaseException as exc:
            error = exc
        self._watch = None
        origins.set_current_test(None)
        if _is_pytest_timeout(error):
            watch.timed_out = True
        fired = budget.outcome if budget is not None and budget.outcome.fired else None
        guard_start = time.monotonic()
        guard_error = None
        try:
            findings = self._check(watch)
            findings += process_group_findings(f"test {item.name}", watch.groups_before)
        except Exception as exc:  # noqa: BLE001 - the guard's own failure is not the test's
            findings, guard_error = [], describe_guard_error(exc)
        guard_s = time.monotonic() - guard_start
        teardown_s = time.monotonic() - start  # the grace waited is part of the teardown
        if fired is not None:
            from pytest_shutdown.report import budget_finding  # noqa: PLC0415

            findings.insert(0, budget_finding(item.name, fired.to_dict()))
        if fired is not None and fired.killed:
            count = len(fired.killed)
            findings.append(
                Finding(
                    "force-killed",
                    f"{count} child process{'es' if count != 1 else ''} of {item.name} killed "
                    f"when its {fired.budget_s:g} s shutdown budget ran out.",
                    {"processes": fired.killed, "budget_s": fired.budget_s},
                )
            )
        plain = [f.to_dict() for f in findings]
        # A test that already failed is one report: the findings go with its failure.
        reported = error is None and not watch.timed_out and not watch.failed
        self.report.add(
            TestRecord(
                nodeid=item.nodeid,
                worker=self.report.worker,
                teardown_s=teardown_s,
                findings=plain,
                budget=fired.to_dict() if fired is not None else None,
                reported=reported,
                guard_s=guard_s,
                guard_error=guard_error,
            )
        )
        for finding in findings:
            item.user_properties.append((f"shutdown:{finding.code}", finding.message))
        if findings and not reported:
            item.add_report_section("teardown", "shutdown guard", self._render(plain))
        if fired is not None:
            item.add_report_section("teardown", "shutdown budget", render_budget(fired.to_dict()))
        if error is not None:
            raise error
        if findings and reported:
            self._complain(item, findings, plain)
        return result

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Attach the guard's section of a test's teardown to its setup error report (also on
        the xdist controller, where the reports arrive one by one). A failed call needs none:
        pytest prints the teardown sections after each failure itself, and the section would
        then be printed twice."""
        if report.when != "teardown":
            if report.failed and report.when == "setup":
                self._failed_reports[report.nodeid] = report
            return
        failed = self._failed_reports.pop(report.nodeid, None)
        if failed is not None:
            failed.sections.extend(
                (name, text) for name, text in report.sections if name == GUARD_SECTION
            )

    def _render(self, plain: list[Any]) -> str:
        return render_findings(plain, details=shows_details(self.config))

    def _complain(self, item: pytest.Item, findings: list[Finding], plain: list[Any]) -> None:
        __tracebackhide__ = True
        if self.settings.mode == "warn":
            # attributed to the test's own line, not to this module
            path, lineno, _ = item.reportinfo()
            warning = ShutdownLeakWarning(self._render(plain))
            with warnings.catch_warnings():
                # Warn mode never fails a test: under -W error / filterwarnings = error the
                # warning is still recorded (pytest's recorder stays in place), never raised.
                warnings.simplefilter("always", ShutdownLeakWarning)
                warnings.warn_explicit(warning, ShutdownLeakWarning, str(path), (lineno or 0) + 1)
            return
        error = ShutdownContractError(findings)
        setattr(error, _GUARD_ATTR, plain)
        raise error

    # --- wider-scope fixtures own what their setup started ---

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        watch = self._watch
        if fixturedef.scope == "function" or watch is None:
            return (yield)
        before = take_snapshot()
        try:
            return (yield)
        finally:
            started = started_since(before, allow=self.tools)
            owned = _Owned(
                fixturedef.argname,
                fixturedef.scope,
                fixturedef.baseid,
                started,
                before.freeze_count,
            )
            self._owned[fixturedef] = owned
            watch.excluded.update(started.threads)
            watch.excluded.update(started.pids)
            watch.freeze_adjust += gc.get_freeze_count() - before.freeze_count
            # Finalizers run last-in first-out: this one runs before the fixture's own teardown.
            fixturedef.addfinalizer(owned.teardown_started)

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owned = self._owned.pop(fixturedef, None)
        if owned is None:
            return
        freeze_now = gc.get_freeze_count()
        watch = self._watch
        if watch is None:  # torn down outside any test (e.g. an interrupted session)
            self._finish_orphan(owned, freeze_now)
            return
        # Whatever the fixture's teardown changed in the freeze count is the fixture's.
        at_teardown = (
            owned.freeze_at_teardown if owned.freeze_at_teardown is not None else freeze_now
        )
        watch.freeze_adjust += freeze_now - at_teardown
        watch.finished.append((owned, freeze_now))

    def _finish_orphan(self, owned: _Owned, freeze_now: int) -> None:
        left = await_exit(owned.started, self.settings.grace_s)
        findings = self._owned_findings(owned, left, freeze_now)
        self._restore(left.pids, owned.freeze_before_setup, freeze_now)
        if findings:
            self.report.add(
                TestRecord(
                    nodeid=f"<fixture {owned.fixture}>",
                    worker=self.report.worker,
                    teardown_s=0.0,
                    findings=[f.to_dict() for f in findings],
                )
            )

    def _owned_findings(
        self, owned: _Owned, left: Started, freeze_now: int, grace: float | None = None
    ) -> list[Finding]:
        return leak_findings(
            left,
            grace=self.settings.grace_s if grace is None else grace,
            subject=f"fixture {owned.fixture!r} ({owned.scope} scope)",
            freeze_before=owned.freeze_before_setup,
            freeze_after=freeze_now,
            extra={"owner": owned.owner()},
        )

    # --- checking and restoring order ---

    def _check(self, watch: _Watch) -> list[Finding]:
        allow = watch.allow
        threads = not (allow is not None and allow.threads is True)
        processes = not (allow is not None and allow.processes)
        gc_freeze = not (allow is not None and allow.gc_freeze)
        filt = self.tools
        if allow is not None and isinstance(allow.threads, tuple):
            filt = thread_filter([is_tool_thread, *allow.threads])
        started = started_since(watch.before, threads=threads, processes=processes, allow=filt)
        freeze_now = gc.get_freeze_count()
        expected = watch.before.freeze_count + watch.freeze_adjust
        if not started and not watch.finished and (freeze_now == expected or not gc_freeze):
            return []  # the common case: nothing to wait for, nothing to report
        live_owned = [o.started for o in self._owned.values()]
        started = started.without(
            [t for t in started.threads if t in watch.excluded]
            + [t for s in live_owned for t in s.threads],
            [p for p in started.pids if p in watch.excluded]
            + [p for s in live_owned for p in s.pids],
        )
        # Whose is it? Decided before any wait, so that what others own costs no grace.
        started = self._without_owned(started, watch.item.nodeid)
        fixtures = Started(
            tuple(t for o, _ in watch.finished for t in o.started.threads),
            tuple(p for o, _ in watch.finished for p in o.started.pids),
        )
        if watch.timed_out or watch.failed:
            # The test already failed (or timed out): no grace for its own leftovers, which go
            # with its failure; fixtures torn down here still get theirs.
            grace = 0.0
            alive = await_exit(started, 0.0, collect=False) if started else Started()
            if fixtures:
                left = await_exit(fixtures, self.settings.grace_s)
                alive = Started(alive.threads + left.threads, alive.pids + left.pids)
        else:  # one deadline for the test's own leftovers and those of fixtures torn down here
            grace = self.settings.grace_s
            combined = Started(started.threads + fixtures.threads, started.pids + fixtures.pids)
            alive = await_exit(combined, grace) if combined else Started()
        findings: list[Finding] = []
        still_threads = set(alive.threads)
        still_pids = set(alive.pids)
        for owned, freeze_at_finish in watch.finished:
            left = Started(
                tuple(t for t in owned.started.threads if t in still_threads),
                tuple(p for p in owned.started.pids if p in still_pids),
            )
            findings.extend(
                self._owned_findings(
                    owned, left, freeze_at_finish, 0.0 if watch.timed_out else None
                )
            )
            before_restore = gc.get_freeze_count()
            self._restore(left.pids, owned.freeze_before_setup, freeze_at_finish)
            expected += gc.get_freeze_count() - before_restore  # an unfreeze is not the test's
        mine = Started(
            tuple(t for t in started.threads if t in still_threads),
            tuple(p for p in started.pids if p in still_pids),
        )
        freeze_now = gc.get_freeze_count()
        findings.extend(
            leak_findings(
                mine,
                grace=grace,
                subject=watch.item.name,
                freeze_before=expected if gc_freeze else None,
                freeze_after=freeze_now if gc_freeze else None,
            )
        )
        self._restore(mine.pids, expected if gc_freeze else freeze_now, freeze_now)
        return findings

    def _fixture_roots(self) -> dict[int, tuple[Any, str, object]]:
        """``id`` of each live wider-scope fixture's value (and suspended generator) -> owner."""
        roots: dict[int, tuple[Any, str, object]] = {}
        for fixturedef, owned in self._owned.items():
            name = f"{owned.fixture!r} ({owned.scope} scope)"
            cached = getattr(fixturedef, "cached_result", None)
            if cached is not None and cached[2] is None and gc.is_tracked(cached[0]):
                roots[id(cached[0])] = (fixturedef, name, cached[0])
            for finalizer in list(getattr(fixturedef, "_finalizers", ())):
                if isinstance(finalizer, functools.partial):
                    for arg in finalizer.args:
                        if isinstance(arg, types.GeneratorType):
                            roots[id(arg)] = (fixturedef, name, arg)
        return roots

    def _without_owned(self, started: Started, nodeid: str) -> Started:
        """Drop what outlives the test: a live wider-scope fixture's (checked at its teardown),
        a module global's or class attribute's (listed at session end), the standard library's
        process-lifetime helpers. What is left is the test's own."""
        if not started:
            return started
        helpers = stdlib_helper_threads()
        threads = tuple(t for t in started.threads if t not in helpers)
        parents = _parent_pids(started.pids)
        owners = find_owners(objects_of(threads, started.pids, parents), self._fixture_roots())
        if not owners:
            return Started(threads, started.pids)
        for fixturedef, owned in self._owned.items():
            adopted_threads = tuple(t for t in threads if _fixture_of(owners.get(t)) is fixturedef)
            adopted_pids = tuple(
                p for p in started.pids if _fixture_of(owners.get(p)) is fixturedef
            )
            if adopted_threads or adopted_pids:
                owned.adopt(adopted_threads, adopted_pids)
        for key, owner in owners.items():
            if owner.kind != "fixture" and key not in self._long_lived:
                self._long_lived[key] = _long_lived_record(key, owner, nodeid)
        return Started(
            tuple(t for t in threads if t not in owners),
            tuple(p for p in started.pids if p not in owners),
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """List the long-lived resources still alive; with ``--shutdown-long-lived=fail`` (on
        the controller, after the workers' lists are merged) they fail the session."""
        for key, record in self._long_lived.items():
            alive = key.is_alive() if isinstance(key, threading.Thread) else process_running(key)
            if alive:
                self.report.add_long_lived(record)
        self._long_lived.clear()
        if hasattr(self.config, "workerinput"):
            return
        if self.settings.long_lived == "fail" and self.report.long_lived:
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _restore(self, pids: tuple[int, ...], freeze_expected: int, freeze_now: int) -> None:
        """Fail mode only: kill leaked process trees; undo a leaked gc.freeze() when there was
        none before. Warn mode changes nothing in the run."""
        if self.settings.mode != "fail":
            return
        if pids:
            kill_process_trees(pids, timeout=5.0)
        if freeze_now > freeze_expected == 0:
            gc.unfreeze()

    def _kill_children(self, watch: _Watch) -> list[dict[str, Any]]:
        """On budget expiry: kill the test's child processes (not those of live fixtures)."""
        started = started_since(watch.before, threads=False)
        owned = {p for o in self._owned.values() for p in o.started.pids}
        owned.update(p for p in self._long_lived if isinstance(p, int))  # a global's pool
        pids = tuple(p for p in started.pids if p not in owned and p not in watch.excluded)
        if pids:  # a pool a fixture value or a global reaches is not the test's to kill
            others = find_owners(objects_of((), pids, _parent_pids(pids)), self._fixture_roots())
            pids = tuple(p for p in pids if p not in others)
        return kill_process_trees(pids, timeout=2.0) if pids else []


def _fixture_of(owner: Owner | None) -> Any:
    return owner.key if owner is not None and owner.kind == "fixture" else None


def _parent_pids(pids: tuple[int, ...]) -> dict[int, int]:
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


def _long_lived_record(key: Any, owner: Owner, nodeid: str) -> dict[str, Any]:
    """What the summary says about a thread or process owned by a global (at session end)."""
    if isinstance(key, threading.Thread):
        origin = origins.origin_of_thread(key)
        what: dict[str, Any] = {"kind": "thread", "name": thread_name(key), "ident": key.ident}
    else:
        origin = origins.origin_of_process(key)
        what = {"kind": "process", "pid": key, "name": origin.what if origin else None}
    return {
        **what,
        "owner": owner.to_dict(),
        "first_test": nodeid,
        "started_at": origins.render_origin(origin) if origin is not None else None,
    }
