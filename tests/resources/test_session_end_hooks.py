"""The session-end hooks of the resource-kind protocol (issue 47): declared with defaults that do
nothing on KindDefaults, implemented by the kinds that have something to do at session end, and
called by the guard for every kind, which names none."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest_shutdown
from pytest_shutdown import resources
from pytest_shutdown.ownership.containment import Containment
from pytest_shutdown.resources.base import KindDefaults, ObjectKind, SessionEndContext, StateKind


class _Report:
    def __init__(self) -> None:
        self.findings: list[tuple[str, list[dict]]] = []  # type: ignore[type-arg]
        self.blocked: list[threading.Thread] = []

    def add_findings(self, nodeid: str, findings: list[dict]) -> None:  # type: ignore[type-arg]
        self.findings.append((nodeid, findings))

    def exit_blocked(self, threads: list[threading.Thread], described: list[dict]) -> None:  # type: ignore[type-arg]
        self.blocked.extend(threads)


def _end(report: _Report, mode: str = "warn") -> SessionEndContext:
    return SessionEndContext(
        mode=mode,
        grace_s=0.5,
        report=report,
        session_start_pids=frozenset(),
        session_start_threads=frozenset(threading.enumerate()),
        containment=Containment(),
        long_lived=(),
        reported_at_end=frozenset(),
    )


def test_the_defaults_do_nothing() -> None:
    report = _Report()
    for base in (KindDefaults, ObjectKind, StateKind):
        kind = base()
        assert kind.sweep_session_end(_end(report)) is None
        assert list(kind.blocking_exit(_end(report))) == []
    assert report.findings == [] and report.blocked == []


def test_a_kind_not_chosen_that_ends_every_session_is_built_for_the_end() -> None:
    threads = resources.load_kind("threads")
    ends = resources.session_end_kinds([threads])
    assert [k.name for k in ends] == [
        n for n in resources.KINDS if n in {"threads"} | set(resources.ENDS_EVERY_SESSION)
    ]
    assert ends[0] is threads
    chosen = resources.default_kinds()
    assert resources.session_end_kinds(chosen) == chosen  # every kind chosen: the guard's own


def test_the_threads_kind_reports_a_non_daemon_thread_that_blocks_the_exit() -> None:
    from pytest_shutdown.resources.threads import REPORTED  # noqa: PLC0415

    report = _Report()
    end = _end(report)
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="blocks-the-exit")
    thread.start()
    try:
        kind = resources.load_kind("threads")
        assert list(kind.blocking_exit(end)) == []  # not reported as a test's leak: not asked
        REPORTED.add(thread)
        assert list(kind.blocking_exit(end)) == [thread]
        assert report.blocked == [thread]  # warn mode: the report says the exit is blocked
        ((nodeid, plain),) = report.findings
        assert nodeid == "<session end>"
        assert "'blocks-the-exit'" in plain[0]["message"]
    finally:
        REPORTED.discard(thread)
        release.set()
        thread.join()


def test_the_guard_names_no_kind_at_session_end() -> None:
    package = Path(pytest_shutdown.__file__).parent
    source = (package / "plugin" / "guard" / "session_end.py").read_text()
    names = set(resources.KINDS)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert node.value not in names, node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            probe = node.func.id in {"getattr", "hasattr"}
            assert not (probe and ast.unparse(node.args[0]).startswith("kind")), ast.unparse(node)
