"""The guard's fixture ledger: a wider-scope fixture owns what its set-up started (and the state
it changed): checked, and blamed on it, when it is torn down, in the check of the test it is
torn down with, else on its own. What its set-up and teardown did is absorbed into the running
test's baseline. The ledger also gives the owner search its roots: the live fixtures' values.
"""

from __future__ import annotations

import functools
import gc
import time
import types
from collections.abc import Generator
from dataclasses import field
from typing import Any

import pytest
from _pytest.scope import Scope

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.plugin.guard.state import Found, GuardState, Snapshot, _Watch
from pytest_shutdown.plugin.report import TestRecord
from pytest_shutdown.resources.base import ResourceKind

_FUNCTION_SCOPE = Scope.Function


@lazy_dataclass
class _Owned:
    """What a wider-scope fixture's setup started, and the state before it."""

    fixture: str
    scope: str
    baseid: str
    started: Found
    state_before_setup: Snapshot
    state_after_setup: Snapshot = field(default_factory=dict)
    state_at_teardown: Snapshot | None = None
    #: ``(id of the fixture's value, whether a module holds it as a global)``, read once.
    value_held_globally: tuple[int, bool] | None = None

    def owner(self) -> dict[str, str]:
        return {"fixture": self.fixture, "scope": self.scope, "baseid": self.baseid}

    def subject(self) -> str:
        return f"fixture {self.fixture!r} ({self.scope} scope)"

    def adopt(self, kind: str, items: tuple[Any, ...]) -> None:
        """Items a test started that this fixture's value reaches."""
        self.started[kind] = self.started.get(kind, ()) + items

    def value_is_a_global(self, value: object) -> bool:
        """Whether a module holds the fixture's value itself as a global (pytest-asyncio's
        session fixture ``event_loop_policy`` returns asyncio's process-wide policy, which
        reaches the loop a test set with ``asyncio.set_event_loop``): what it reaches is that
        global's (long-lived, listed), not the fixture's to be blamed for at its teardown."""
        known = self.value_held_globally
        if known is None or known[0] != id(value):
            from pytest_shutdown.ownership.owners import module_holding  # noqa: PLC0415

            known = self.value_held_globally = (id(value), module_holding(value) is not None)
        return known[1]


class FixtureLedger(GuardState):
    """Wider-scope fixtures own what their set-up started (``self._owned``)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        __tracebackhide__ = True  # a fixture's set-up error shows the user's frames alone
        watch = self._watch
        if (
            watch is None
            or getattr(fixturedef, "_scope", None) is _FUNCTION_SCOPE
            or fixturedef.scope == "function"  # (the property builds an enum's value)
        ):
            return (yield)
        start = self._snapshot(self.kinds)
        try:
            return (yield)
        finally:
            started: Found = {}
            for kind in self._objects:
                items = tuple(kind.new_since(start[kind.name]))
                if items:
                    started[kind.name] = items
            end = self._snapshot(self._states)
            owned = _Owned(
                fixturedef.argname,
                fixturedef.scope,
                fixturedef.baseid,
                started,
                {kind.name: start[kind.name] for kind in self._states},
                end,
            )
            self._owned[fixturedef] = owned
            watch.marks = None
            for kind in self.kinds:  # what its set-up started or changed is not the test's
                if watch.before.get(kind.name) is not None:
                    watch.before[kind.name] = kind.absorb(
                        watch.before[kind.name], start[kind.name], end.get(kind.name)
                    )

            def teardown_started() -> None:
                owned.state_at_teardown = self._snapshot(self._states)
                _its_own_to_stop(owned)

            # Finalizers run last-in first-out: this one runs before the fixture's own teardown.
            fixturedef.addfinalizer(teardown_started)

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owned = self._owned.pop(fixturedef, None)
        if owned is None:
            return
        now = self._snapshot(self._states)
        watch = self._watch
        if watch is None:  # torn down outside any test (e.g. an interrupted session)
            self._finish_orphan(owned, now)
            return
        watch.marks = None
        at_teardown = owned.state_at_teardown if owned.state_at_teardown is not None else now
        for kind in self._states:
            watch.before[kind.name] = kind.absorb(
                watch.before[kind.name], at_teardown[kind.name], now[kind.name]
            )
        watch.finished.append((owned, now))

    def _finished_findings(self, watch: _Watch, alive: dict[str, set[Any]]) -> list[Finding]:
        """The findings of the fixtures torn down with the test; their undo is not the test's."""
        findings: list[Finding] = []
        for owned, state_at_finish in watch.finished:
            left = {
                name: tuple(i for i in items if i in alive.get(name, ()))
                for name, items in owned.started.items()
            }
            before_restore = self._snapshot(self._states)
            findings.extend(
                self._owned_findings(owned, left, state_at_finish, 0.0 if watch.timed_out else None)
            )
            after_restore = self._snapshot(self._states)
            for kind in self._states:
                watch.before[kind.name] = kind.absorb(
                    watch.before[kind.name], before_restore[kind.name], after_restore[kind.name]
                )
        return findings

    def _finish_orphan(self, owned: _Owned, state_now: Snapshot) -> None:
        deadline = time.monotonic() + self.settings.grace_s
        left = {
            kind.name: tuple(kind.settle(owned.started.get(kind.name, ()), deadline))
            for kind in self._objects
        }
        findings = self._owned_findings(owned, left, state_now)
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
        self, owned: _Owned, left: Found, state_now: Snapshot, grace: float | None = None
    ) -> list[Finding]:
        """The fixture's findings; in fail mode, order restored for what it owns."""
        grace = self.settings.grace_s if grace is None else grace
        extra = {"owner": owned.owner()}
        findings: list[Finding] = []
        restore: list[tuple[ResourceKind, tuple[Any, ...]]] = []
        for kind in self.kinds:
            if kind.stateful:
                items = self._fixture_state_left(kind, owned, state_now)
            else:
                items = self._not_kept_by_libraries(kind, owned, left.get(kind.name, ()))
            if items:
                findings.extend(kind.findings(items, owned.subject(), grace=grace, extra=extra))
                restore.append((kind, items))
        if self.settings.mode == "fail":
            for kind, items in restore:
                kind.restore(items)
        return findings

    def _not_kept_by_libraries(
        self, kind: ResourceKind, owned: _Owned, items: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        """``items`` less what a native library keeps for the process's lifetime (Ray's gRPC
        pollers and log files after ``ray.shutdown()``): listed as long-lived, not a finding."""
        if not items:
            return items
        kept = kind.kept_by_libraries(items)
        for item, library in kept.items():
            key = (kind.name, item)
            if key not in self._long_lived:
                what = item.long_lived() if hasattr(item, "long_lived") else {"kind": kind.name}
                self._long_lived[key] = {
                    **what,
                    "owner": {"kind": "native library", "name": library, "path": ""},
                    "first_test": owned.subject(),
                    "started_at": None,
                }
        return tuple(i for i in items if i not in kept) if kept else items

    @staticmethod
    def _fixture_state_left(
        kind: ResourceKind, owned: _Owned, state_now: Snapshot
    ) -> tuple[Any, ...]:
        """What the fixture's set-up or teardown changed and is still not as before its set-up
        (what tests changed in between was theirs)."""
        before = owned.state_before_setup[kind.name]
        mine = {c.key for c in kind.diff(before, owned.state_after_setup.get(kind.name, before))}
        at_teardown = (owned.state_at_teardown or {}).get(kind.name)
        if at_teardown is not None:
            mine |= {c.key for c in kind.diff(at_teardown, state_now[kind.name])}
        if not mine:
            return ()
        return tuple(c for c in kind.diff(before, state_now[kind.name]) if c.key in mine)

    def _not_live_owned(self, found: Found) -> Found:
        """``found`` less what a live fixture started (checked at the fixture's teardown)."""
        live = self._live_owned()
        return {k: tuple(i for i in v if i not in live.get(k, ())) for k, v in found.items()}

    def _live_owned(self) -> dict[str, set[Any]]:
        live_owned: dict[str, set[Any]] = {}
        for owned in self._owned.values():
            for name, items in owned.started.items():
                live_owned.setdefault(name, set()).update(items)
        return live_owned

    def _fixture_roots(self) -> dict[int, tuple[Any, str, object]]:
        """``id`` of each live wider-scope fixture's value (and suspended generator) -> owner;
        not a value that is a module's global (the owner search finds the global instead)."""
        roots: dict[int, tuple[Any, str, object]] = {}
        for fixturedef, owned in self._owned.items():
            name = f"{owned.fixture!r} ({owned.scope} scope)"
            cached = getattr(fixturedef, "cached_result", None)
            if (
                cached is not None
                and cached[2] is None
                and gc.is_tracked(cached[0])
                and not owned.value_is_a_global(cached[0])
            ):
                roots[id(cached[0])] = (fixturedef, name, cached[0])
            for finalizer in list(getattr(fixturedef, "_finalizers", ())):
                if isinstance(finalizer, functools.partial):
                    for arg in finalizer.args:
                        if isinstance(arg, types.GeneratorType):
                            roots[id(arg)] = (fixturedef, name, arg)
        return roots


def _its_own_to_stop(owned: _Owned) -> None:
    """A wider-scope fixture's teardown is about to run: the processes it owns still running now,
    and their descendants, are its own to stop (never collateral); one that died before (a
    test's blanket kill) stays a victim."""
    pids = owned.started.get("processes", ())
    if not pids:
        return
    from pytest_shutdown._os.killer import record_ordered_end, tree_of  # noqa: PLC0415
    from pytest_shutdown.resources.primitives import process_running  # noqa: PLC0415

    tree = [m for pid in pids for m in tree_of(pid) if process_running(m)]
    record_ordered_end(tree, f"the teardown of fixture {owned.fixture!r} ({owned.scope} scope)")
