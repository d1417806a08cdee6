"""Review bug 1: ``weakref.finalize(self, self.shutdown)``.

The finalizer registry holds its func strongly; a bound method of ``self`` holds ``self``; so the
renderer is never collected and its pools and cache are never released. Fixed: the finalizer's
func is the ExitStack's ``close``, which does not reach ``self``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError, assert_finalizes_on_gc


class Cache:
    def close(self) -> None:
        pass


class BuggyRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        # the bug: a bound method of self holds self
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(self, self.shutdown)
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._resources.callback(self._executor.shutdown, wait=False)
        cache = Cache()
        self._resources.callback(cache.close)

    def shutdown(self) -> None:
        self._resources.close()


class FixedRenderer(BuggyRenderer):
    def __init__(self) -> None:
        super().__init__()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self._resources.close)


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert error.codes == [code], error.codes
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="finalize with a bound method")
def test_buggy_renderer_is_never_collected() -> None:
    try:
        assert_finalizes_on_gc(BuggyRenderer, timeout=0.5)
    except ShutdownContractError as error:
        expect("finalizer-bound-method", error)


def test_fixed_renderer_is_collected_and_cleaned_up() -> None:
    assert_finalizes_on_gc(FixedRenderer)
