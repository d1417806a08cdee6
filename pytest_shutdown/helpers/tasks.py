"""``no_task_leaks()``: asyncio tasks created in a block must not outlive it (``task-leak``).

One context manager, usable both ways::

    with no_task_leaks():            # sync code that runs loops (asyncio.run, a Runner)
        asyncio.run(serve_and_stop())

    async with no_task_leaks():      # inside a coroutine: the grace lets the loop run
        engine = AsyncEngine()
        await engine.aclose()        # must cancel and await its output handler

At the end of the block, the tasks created inside it, on any loop (one made before the block
and running in another thread too, a server's), that are still pending (after a bounded
grace: ``async with`` sleeps in short steps, so that the loop can finish them; ``with`` polls only
while the tasks' loops run in other threads, since sleeping would block a loop of this thread),
and those still pending when their loop's runner shut down inside the block (``asyncio.run``
cancelled them), are reported as ``task-leak`` with their coroutine and the call site of
``create_task``. When the block raises, its exception propagates and nothing is checked.
Recording is :mod:`pytest_shutdown.resources._asyncio_record` (it imports no asyncio).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from pytest_shutdown._base.arguments import CalledBeforeWith
from pytest_shutdown.findings.finding import ShutdownContractError
from pytest_shutdown.helpers.report import is_seconds
from pytest_shutdown.resources import _asyncio_record as record
from pytest_shutdown.resources.asyncio_tasks import left_since, task_findings

__all__ = ["no_task_leaks"]

#: Seconds given by default to the block's tasks to end.
DEFAULT_GRACE_S = 1.0


class no_task_leaks(metaclass=CalledBeforeWith):  # noqa: N801 - used like a function
    """Fail with ``task-leak`` when an asyncio task created in the block is still pending at its
    end, after ``grace`` seconds (see the module docstring); ``async with`` and ``with``."""

    def __init__(self, *, grace: float = DEFAULT_GRACE_S) -> None:
        if not is_seconds(grace, zero_ok=True):  # a bool, NaN or inf is no deadline
            raise ValueError(
                f"no_task_leaks(grace=...) must be a finite number of seconds >= 0, got {grace!r}"
            )
        self.grace = grace
        self._start: int | None = None

    # --- sync ---

    def __enter__(self) -> no_task_leaks:
        record.install()
        self._start = record.seq()
        return self

    def __exit__(self, typ: type[BaseException] | None, *_: object) -> None:
        __tracebackhide__ = True
        with self._ending(typ) as waiting:
            for left in waiting:
                if not _elsewhere(left):
                    break  # sleeping here would block the loops of this thread
                time.sleep(0.005)

    # --- async ---

    async def __aenter__(self) -> no_task_leaks:
        return self.__enter__()

    async def __aexit__(self, typ: type[BaseException] | None, *_: object) -> None:
        __tracebackhide__ = True
        with self._ending(typ) as waiting:
            if typ is None:
                import asyncio  # noqa: PLC0415 - running in a loop: loaded

            for _left in waiting:
                await asyncio.sleep(0.005)

    @contextlib.contextmanager
    def _ending(self, typ: type[BaseException] | None) -> Iterator[Iterator[list[record.Entry]]]:
        """The block's end: yields the waits (what is left, each time, until the grace ran out
        or nothing is), then raises on what is left; nothing when the block raised."""
        __tracebackhide__ = True
        left: list[record.Entry] = []

        def waits() -> Iterator[list[record.Entry]]:
            nonlocal left
            deadline = time.monotonic() + self.grace
            left = self._left()
            while left and time.monotonic() < deadline:
                yield left
                left = self._left()

        try:
            yield waits() if typ is None else iter(())
            if typ is None:
                self._raise(left)
        finally:
            record.uninstall()

    def _left(self) -> list[record.Entry]:
        current = _current_task()
        return [
            e
            for e in left_since((self._start or 0, ()), in_tests_only=False, on_any_loop=True)
            if e.what == "task" and (current is None or e.obj() is not current)
        ]

    def _raise(self, left: list[record.Entry]) -> None:
        __tracebackhide__ = True
        if left:
            raise ShutdownContractError(task_findings(left, "the block", self.grace))


def _current_task() -> Any:
    import sys  # noqa: PLC0415

    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


def _elsewhere(left: list[record.Entry]) -> bool:
    """Some task's loop runs (in another thread: this one is in the ``with`` block's code)."""
    for entry in left:
        task = entry.obj()
        loop = task.get_loop() if task is not None else None
        if loop is not None and loop.is_running():
            return True
    return False
