"""Review bug 4: ``shutdown()`` called twice (AsyncLLM and the launcher both call it) closes the
MM processor cache twice. Fixed: one ExitStack, whose ``close()`` runs each callback once.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from pytest_shutdown import ShutdownContractError, assert_idempotent_shutdown


class MMProcessorCache:
    def __init__(self) -> None:
        self.items: dict[str, object] = {"image": object()}

    def close(self) -> None:
        self.items.clear()


class BuggyRenderer:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=2)
        self.mm_processor_cache = MMProcessorCache()

    def shutdown(self) -> None:  # the bug: nothing remembers it already ran
        self._executor.shutdown(wait=False)
        self.mm_processor_cache.close()


class FixedRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=2)
        self._resources.callback(self._executor.shutdown, wait=False)
        cache = MMProcessorCache()
        self._resources.callback(cache.close)
        self.mm_processor_cache = cache

    def shutdown(self) -> None:
        self._resources.close()


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    assert "mm_processor_cache.close" in {f.details["cleanup"] for f in error.findings}
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="cleanup repeated")
def test_buggy_renderer_closes_the_cache_again() -> None:
    try:
        assert_idempotent_shutdown(BuggyRenderer(), calls=2)
    except ShutdownContractError as error:
        expect("cleanup-repeated", error)


def test_fixed_renderer_runs_each_cleanup_once() -> None:
    assert_idempotent_shutdown(FixedRenderer(), calls=3)
