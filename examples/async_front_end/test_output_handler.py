"""An asyncio front end's output handler, checked with ``no_task_leaks()`` (docs/async.md).

``FrontEnd`` has the shape of vLLM's ``AsyncLLM``: a task started in ``__init__`` that reads
outputs until the front end is closed; ``aclose()`` must cancel it and await it. With the bug
(``cancel_handler=False``) the handler is still pending after ``aclose()``: ``asyncio.run`` or
the loop fixture would cancel it later, at a moment it did not choose (vLLM #48745), and the
guard reports ``task-leak`` naming ``FrontEnd._output_handler`` and the ``create_task`` line.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pytest_shutdown import ShutdownContractError, no_task_leaks


class FrontEnd:
    def __init__(self, *, cancel_handler: bool = True) -> None:
        self.cancel_handler = cancel_handler
        self.outputs: asyncio.Queue[str] = asyncio.Queue()
        self.handler = asyncio.get_running_loop().create_task(self._output_handler())

    async def _output_handler(self) -> None:
        while True:
            await self.outputs.get()

    async def aclose(self) -> None:
        if self.cancel_handler:
            self.handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.handler


def test_aclose_stops_the_output_handler() -> None:
    async def main() -> None:
        async with no_task_leaks():
            front_end = FrontEnd()
            await front_end.outputs.put("hello")
            await front_end.aclose()

    asyncio.run(main())


def test_a_handler_left_pending_is_a_task_leak() -> None:
    async def main() -> None:
        with pytest.raises(ShutdownContractError) as caught:
            async with no_task_leaks(grace=0.05):
                front_end = FrontEnd(cancel_handler=False)
                await front_end.aclose()  # the bug: the handler is never cancelled
        assert caught.value.codes == ["task-leak"]
        front_end.cancel_handler = True  # the fix, as the test's own clean-up
        await front_end.aclose()

    asyncio.run(main())


def test_serving_leaves_nothing_for_asyncio_run_to_cancel() -> None:
    async def serve() -> None:
        front_end = FrontEnd()
        await front_end.aclose()

    with no_task_leaks():
        asyncio.run(serve())
