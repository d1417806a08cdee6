"""Growth 3: an output thread per engine that shutdown never stops or joins.

Each engine starts a thread that waits on its output queue; ``shutdown()`` forgets it, so every
cycle leaves one more thread blocked forever (and with it the queue and whatever it holds).
Fixed: shutdown puts a sentinel on the queue and joins the thread with a deadline.
"""

from __future__ import annotations

import queue
import threading

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth

#: Joined with this deadline at shutdown (every wait has one).
JOIN_TIMEOUT_S = 5.0
STOP = object()


def drain(outputs: queue.Queue[object]) -> None:
    while outputs.get() is not STOP:
        pass


class ThreadedEngine:
    def __init__(self) -> None:
        self.outputs: queue.Queue[object] = queue.Queue()
        self.thread = threading.Thread(
            target=drain, args=(self.outputs,), name="output-handler", daemon=True
        )
        self.thread.start()

    def shutdown(self) -> None:
        pass  # the bug: the output thread is never told to stop


class FixedEngine(ThreadedEngine):
    def shutdown(self) -> None:
        self.outputs.put(STOP)
        self.thread.join(JOIN_TIMEOUT_S)


def cycle(engine_class: type[ThreadedEngine], queues: list[queue.Queue[object]]) -> None:
    engine = engine_class()
    engine.outputs.put("token")
    engine.shutdown()
    queues.append(engine.outputs)  # to stop a leaked thread after the check


def expect(error: ShutdownContractError) -> None:
    found = {f.details.get("metric"): f.message for f in error.findings}
    assert set(error.codes) == {"growth"}, error.codes
    assert found["threads"].startswith("threads: +1 per cycle (3 cycles); new: 'output-handler'")
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="a thread per cycle")
def test_buggy_engine_leaves_a_thread_per_cycle() -> None:
    queues: list[queue.Queue[object]] = []
    try:
        assert_no_growth(lambda: cycle(ThreadedEngine, queues), cycles=3, warmup=1)
    except ShutdownContractError as error:
        expect(error)
    finally:
        for outputs in queues:  # nothing a test starts may outlive it
            outputs.put(STOP)


def test_fixed_engine_joins_its_thread() -> None:
    queues: list[queue.Queue[object]] = []
    assert_no_growth(lambda: (cycle(FixedEngine, queues), queues.clear()), cycles=3, warmup=1)
