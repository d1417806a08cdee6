"""Review bug 2: ``weakref.finalize(self, _shutdown_renderer, self)``.

The same leak in another shape: the registry holds the finalizer's arguments strongly, and the
first argument is ``self``. Fixed: no argument reaches ``self``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError, assert_finalizers_ok, assert_finalizes_on_gc


class BuggyRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        # the bug: the registry holds the args, and the first one is self
        self._finalizer: weakref.finalize[Any, Any]
        self._finalizer = weakref.finalize(self, _shutdown_renderer, self)
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._resources.callback(self._executor.shutdown, wait=False)

    def shutdown(self) -> None:
        self._resources.close()


def _shutdown_renderer(renderer: BuggyRenderer) -> None:
    renderer.shutdown()


class FixedRenderer(BuggyRenderer):
    def __init__(self) -> None:
        super().__init__()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self._resources.close)


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert error.codes == [code], error.codes
    assert error.findings[0].details["path"] == "args[0]"
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="finalize with self in args")
def test_buggy_renderer_is_never_collected() -> None:
    try:
        assert_finalizes_on_gc(BuggyRenderer, timeout=0.5)
    except ShutdownContractError as error:
        expect("finalizer-holds-object", error)


def test_fixed_renderer_is_collected_and_its_finalizer_is_clean() -> None:
    renderer = FixedRenderer()
    assert_finalizers_ok(renderer)
    renderer.shutdown()
    assert_finalizes_on_gc(FixedRenderer)
