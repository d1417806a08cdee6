"""Review bug 3: ``self._resources.enter_context(executor)``.

``Executor.__exit__`` is ``shutdown(wait=True)``: closing the stack now waits for every running
task, which breaks the fast abort path (``shutdown_timeout=0``). Fixed:
``callback(executor.shutdown, wait=False)``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from pytest_shutdown import ShutdownContractError, assert_nonblocking_shutdown


class BuggyRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._resources.enter_context(self._executor)  # the bug

    def shutdown(self) -> None:
        self._resources.close()


class FixedRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._resources.callback(self._executor.shutdown, wait=False)

    def shutdown(self) -> None:
        self._resources.close()


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert error.codes == [code], error.codes
    assert error.findings[0].details["executors"] == ["_executor"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="enter_context(executor)")
def test_buggy_renderer_blocks_on_running_tasks() -> None:
    try:
        assert_nonblocking_shutdown(BuggyRenderer(), budget=0.25)
    except ShutdownContractError as error:
        expect("blocking-close", error)


def test_fixed_renderer_returns_while_tasks_run() -> None:
    assert_nonblocking_shutdown(FixedRenderer(), budget=0.25)
