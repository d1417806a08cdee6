"""``no_task_leaks()`` (issue 48, point 3): sync and async, both sides."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError, no_task_leaks


async def _forever() -> None:
    await asyncio.sleep(100)


class _Engine:
    def __init__(self, *, cancel: bool) -> None:
        self.cancel = cancel
        self.handler = asyncio.get_running_loop().create_task(_forever())

    async def aclose(self) -> None:
        if self.cancel:
            self.handler.cancel()
            try:
                await self.handler
            except asyncio.CancelledError:
                pass


def test_async_block_that_leaves_its_handler_pending_fails() -> None:
    async def main() -> None:
        engine = None
        with pytest.raises(ShutdownContractError) as caught:
            async with no_task_leaks(grace=0.05):
                engine = _Engine(cancel=False)
                await engine.aclose()
        (finding,) = caught.value.findings
        assert finding.code == "task-leak"
        assert finding.details["name"].endswith("_forever")
        assert "_Engine.__init__" in finding.details["created_at"]
        engine.handler.cancel()  # type: ignore[union-attr]

    asyncio.run(main())


def test_async_block_whose_aclose_awaits_its_handler_passes() -> None:
    async def main() -> None:
        async with no_task_leaks(grace=0.05):
            engine = _Engine(cancel=True)
            await engine.aclose()

    asyncio.run(main())


def test_async_grace_lets_a_task_on_its_way_out_finish() -> None:
    async def main() -> None:
        async with no_task_leaks(grace=1.0):
            asyncio.get_running_loop().create_task(asyncio.sleep(0.01))

    asyncio.run(main())


def test_sync_block_around_asyncio_run_fails_on_a_task_left_for_the_runner() -> None:
    async def main() -> None:
        asyncio.get_running_loop().create_task(_forever())
        await asyncio.sleep(0)

    with pytest.raises(ShutdownContractError) as caught:
        with no_task_leaks(grace=0.0):
            asyncio.run(main())
    assert caught.value.codes == ["task-leak"]
    assert caught.value.findings[0].details["state"] == "cancelled-by-runner"


def test_sync_block_around_a_clean_asyncio_run_passes() -> None:
    async def main() -> None:
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))

    with no_task_leaks():
        asyncio.run(main())


@contextmanager
def _loop_in_a_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop made before the block, running in another thread (a server's)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-serving-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def _start_on(
    loop: asyncio.AbstractEventLoop, coro_fn: Callable[[], Coroutine[Any, Any, None]]
) -> asyncio.Task[None]:
    async def start() -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro_fn())

    return asyncio.run_coroutine_threadsafe(start(), loop).result(5)


def test_sync_block_fails_on_a_task_it_left_on_an_older_loop_in_another_thread() -> None:
    with _loop_in_a_thread() as loop:
        task = None
        with pytest.raises(ShutdownContractError) as caught:
            with no_task_leaks(grace=0.05):
                task = _start_on(loop, _forever)
        (finding,) = caught.value.findings
        assert finding.code == "task-leak" and finding.details["name"].endswith("_forever")
        assert task is not None
        loop.call_soon_threadsafe(task.cancel)


def test_sync_block_waits_for_a_task_ending_on_an_older_loop_in_another_thread() -> None:
    async def short() -> None:
        await asyncio.sleep(0.02)

    with _loop_in_a_thread() as loop:
        with no_task_leaks(grace=2.0):
            _start_on(loop, short)


def test_the_blocks_own_exception_propagates_unchecked() -> None:
    async def main() -> None:
        asyncio.get_running_loop().create_task(_forever())
        await asyncio.sleep(0)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        with no_task_leaks():
            asyncio.run(main())


@pytest.mark.parametrize("grace", [-1, float("nan"), float("inf"), True, "2"])
def test_a_grace_that_is_no_finite_number_of_seconds_is_refused(grace: object) -> None:
    """A NaN or infinite grace would be a wait with no deadline, a bool a typo."""
    with pytest.raises(ValueError, match=r"grace=\.\.\.\) must be a finite number of seconds"):
        no_task_leaks(grace=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize("grace", [0, 0.5])
def test_a_zero_or_finite_grace_is_taken(grace: float) -> None:
    assert no_task_leaks(grace=grace).grace == grace
