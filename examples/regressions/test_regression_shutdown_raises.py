"""Review bug 5: a shutdown that raises the second time.

The old renderer dropped its cache attribute on shutdown; the second call (the duplicated
``engine_client.shutdown``) then failed with ``AttributeError`` and skipped the engine-core
shutdown that followed it. Fixed: every cleanup is registered once, on an ExitStack.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from pytest_shutdown import ShutdownContractError, assert_idempotent_shutdown


class MMProcessorCache:
    def close(self) -> None:
        pass


class BuggyRenderer:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1)
        self.mm_processor_cache: MMProcessorCache | None = MMProcessorCache()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)
        self.mm_processor_cache.close()  # type: ignore[union-attr]  # None the second time
        self.mm_processor_cache = None


class FixedRenderer:
    def __init__(self) -> None:
        self._resources = ExitStack()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._executor = ThreadPoolExecutor(max_workers=1)
        self._resources.callback(self._executor.shutdown, wait=False)
        cache = MMProcessorCache()
        self._resources.callback(cache.close)
        self.mm_processor_cache: MMProcessorCache | None = cache

    def shutdown(self) -> None:
        self._resources.close()


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert code in error.codes, error.codes
    raised = [f for f in error.findings if f.code == code]
    assert "AttributeError" in raised[0].details["traceback"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="second shutdown raises")
def test_buggy_renderer_raises_on_the_second_shutdown() -> None:
    try:
        assert_idempotent_shutdown(BuggyRenderer(), calls=2)
    except ShutdownContractError as error:
        expect("shutdown-raised", error)


def test_fixed_renderer_can_be_shut_down_any_number_of_times() -> None:
    assert_idempotent_shutdown(FixedRenderer(), calls=3)


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="racing shutdowns raise")
def test_buggy_renderer_raises_when_shut_down_from_several_threads_at_once() -> None:
    """A signal handler, an atexit hook and a finalizer may call ``shutdown()`` at once: every
    call after the first raises the same error, reported once with its count."""
    try:
        assert_idempotent_shutdown(BuggyRenderer(), calls=2, threads=4)
    except ShutdownContractError as error:
        expect("shutdown-raised", error)
