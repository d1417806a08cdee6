"""The helpers' forms for an ``async def`` test: each awaits the object's coroutine method
(``aclose`` by default) on the test's own running loop, where its tasks and sockets live.

From a sync test, the helpers of :mod:`pytest_shutdown` take a coroutine method as they are (they
run it on a fresh loop); inside a running loop they cannot, and raise ``RuntimeError`` naming the
form here to await. Names are resolved lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_shutdown._fast.lazy_exports import lazy_exports

_LAZY: dict[str, str] = {
    "assert_idempotent_shutdown_async": "pytest_shutdown.helpers.async_shutdown",
    "assert_nonblocking_shutdown_async": "pytest_shutdown.helpers.async_shutdown",
    "assert_finalizes_on_gc_async": "pytest_shutdown.helpers.async_shutdown",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports("pytest_shutdown.aio", _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.helpers.async_shutdown import (
        assert_finalizes_on_gc_async as assert_finalizes_on_gc_async,
    )
    from pytest_shutdown.helpers.async_shutdown import (
        assert_idempotent_shutdown_async as assert_idempotent_shutdown_async,
    )
    from pytest_shutdown.helpers.async_shutdown import (
        assert_nonblocking_shutdown_async as assert_nonblocking_shutdown_async,
    )
