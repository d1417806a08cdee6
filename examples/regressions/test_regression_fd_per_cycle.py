"""Growth 4: a file descriptor per engine that shutdown never closes.

Each engine opens a wake-up pipe (as engines open ZMQ sockets, event fds or log files) and its
``shutdown()`` closes only the read end: one descriptor more per cycle, until the process runs
out of them. Fixed: shutdown closes both ends.
"""

from __future__ import annotations

import os

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth


class PipeEngine:
    def __init__(self) -> None:
        self.wake_read, self.wake_write = os.pipe()

    def shutdown(self) -> None:
        os.close(self.wake_read)  # the bug: the write end stays open


class FixedEngine(PipeEngine):
    def shutdown(self) -> None:
        os.close(self.wake_read)
        os.close(self.wake_write)


def cycle(engine_class: type[PipeEngine], left_open: list[int]) -> None:
    engine = engine_class()
    os.write(engine.wake_write, b"x")
    engine.shutdown()
    if engine_class is PipeEngine:
        left_open.append(engine.wake_write)


def expect(error: ShutdownContractError) -> None:
    assert set(error.codes) == {"growth"}, error.codes
    message = error.findings[0].message
    assert message.startswith("file descriptors: +1 per cycle (3 cycles); new: ")
    assert "pipe:[" in message
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="an fd per cycle")
def test_buggy_engine_leaves_a_descriptor_per_cycle() -> None:
    left_open: list[int] = []
    try:
        assert_no_growth(lambda: cycle(PipeEngine, left_open), cycles=3, warmup=1)
    except ShutdownContractError as error:
        expect(error)
    finally:
        for fd in left_open:
            os.close(fd)


def test_fixed_engine_closes_its_descriptors() -> None:
    assert_no_growth(lambda: cycle(FixedEngine, []), cycles=3, warmup=1)
