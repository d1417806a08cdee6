"""Escaped processes found by the session marker (pytest_shutdown._os.escaped): a process
caught inside an exec, whose environment reads empty for a moment, is still found (a busy
machine made a shell's background job escape its test: issue 46)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pytest_shutdown._os import escaped

MARKER = "PYTEST_SHUTDOWN_TEST_ESCAPED"


@pytest.fixture
def marked_child() -> Iterator[subprocess.Popen[bytes]]:
    """A child carrying the marker, with the watch set to find it as new."""
    previous = escaped.watch_marker(MARKER, "tok-escaped")
    before = _last_pid()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, MARKER: "tok-escaped"},
    )
    escaped._looked_to = int(before)  # the next look covers the pids allocated since
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)
        escaped.restore_watch(previous)


def _last_pid() -> bytes:
    with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
        return f.read().strip()


def _reads_empty_first(times: int, monkeypatch: pytest.MonkeyPatch, pid: int) -> list[int]:
    """Make the child's environment read empty ``times`` times, as inside an exec."""
    reads: list[int] = []
    real = escaped._read_environ

    def reader(asked: int) -> bytes | None:
        if asked == pid:
            reads.append(asked)
            if len(reads) <= times:
                return b""
        return real(asked)

    monkeypatch.setattr(escaped, "_read_environ", reader)
    return reads


def test_a_process_caught_inside_an_exec_is_read_again_and_found(
    marked_child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _reads_empty_first(3, monkeypatch, marked_child.pid)
    found = escaped.escaped_processes(frozenset(), _last_pid())
    assert marked_child.pid in found
    assert len(reads) >= 4  # read empty three times, then with the marker


def test_one_still_empty_after_the_wait_is_read_once_more_at_the_next_look(
    marked_child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(escaped, "EXEC_PATIENCE_S", 0.0)
    reads = _reads_empty_first(1, monkeypatch, marked_child.pid)
    assert marked_child.pid not in escaped.escaped_processes(frozenset(), _last_pid())
    unread, looked_to = set(escaped._unread), escaped._looked_to
    found = escaped.escaped_processes(frozenset(), _last_pid())
    # (It failed once in a loaded CI run, found empty: the state says which step missed it.)
    assert marked_child.pid in found, (
        f"reads={reads} unread after the first look={unread} looked_to={looked_to} "
        f"watching={escaped.watching()} alive={marked_child.poll() is None}"
    )


def test_a_process_with_no_environment_at_all_costs_one_wait_and_is_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``env -i``: nothing to find; it is waited for once (bounded), read once more, then left."""
    previous = escaped.watch_marker(MARKER, "tok-escaped")
    monkeypatch.setattr(escaped, "EXEC_PATIENCE_S", 0.05)
    before = _last_pid()
    child = subprocess.Popen(["sleep", "30"], env={})
    try:
        escaped._looked_to = int(before)
        assert child.pid not in escaped.escaped_processes(frozenset(), _last_pid())
        assert child.pid in escaped._unread
        assert child.pid not in escaped.escaped_processes(frozenset(), _last_pid())
        assert child.pid not in escaped._unread  # looked at once more, then left
    finally:
        child.kill()
        child.wait(timeout=10)
        escaped.restore_watch(previous)


def test_kernel_threads_are_never_waited_for() -> None:
    assert escaped._is_kernel_thread(2)  # kthreadd
    assert not escaped._is_kernel_thread(os.getpid())
