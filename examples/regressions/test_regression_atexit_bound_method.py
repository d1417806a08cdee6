"""``atexit.register(self.shutdown)`` in an engine's ``__init__`` (SGLang's ``Engine``): the
bound method keeps every engine, and all it holds, alive until the interpreter exits, and
``gc.get_referrers`` cannot see atexit's hold. Fixed: ``weakref.finalize`` on a function that
does not hold ``self`` (it runs at exit too, and on collection).
"""

from __future__ import annotations

import atexit
import weakref

import pytest

from pytest_shutdown import ShutdownContractError, assert_finalizes_on_gc


class Resources:
    def __init__(self) -> None:
        self.kv_cache = bytearray(1 << 16)

    def release(self) -> None:
        self.kv_cache = bytearray()


class BuggyEngine:
    def __init__(self) -> None:
        self.resources = Resources()
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        self.resources.release()


class FixedEngine:
    def __init__(self) -> None:
        self.resources = Resources()
        self._finalizer = weakref.finalize(self, Resources.release, self.resources)

    def shutdown(self) -> None:
        self._finalizer()


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="atexit holds the engine")
def test_buggy_engine_is_kept_alive_by_atexit() -> None:
    try:
        assert_finalizes_on_gc(BuggyEngine, timeout=0.5)
    except ShutdownContractError as error:
        assert error.codes == ["not-collected"], error.codes
        assert error.findings[0].details["root"] == "atexit"
        raise


def test_fixed_engine_is_collected_and_releases_its_resources() -> None:
    assert_finalizes_on_gc(FixedEngine, watch=["resources.release"])
