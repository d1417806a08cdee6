"""Growth 2: a module registry that appends every engine and never lets go.

A list of "all engines, to shut them down at exit" keeps each one alive after its own
``shutdown()``: one more engine per cycle. Fixed: a ``weakref.WeakSet`` (an engine that is gone
needs no shutdown at exit).
"""

from __future__ import annotations

import weakref

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth

ALL_ENGINES: list[RegisteredEngine] = []
LIVE_ENGINES: weakref.WeakSet[FixedEngine] = weakref.WeakSet()


class RegisteredEngine:
    def __init__(self) -> None:
        self.requests: dict[str, list[int]] = {}
        ALL_ENGINES.append(self)  # the bug: a strong reference for the life of the process

    def shutdown(self) -> None:
        self.requests.clear()


class FixedEngine(RegisteredEngine):
    def __init__(self) -> None:
        self.requests = {}
        LIVE_ENGINES.add(self)


def cycle(engine_class: type[RegisteredEngine]) -> None:
    engine = engine_class()
    engine.requests["r1"] = [1, 2, 3]
    engine.shutdown()


def expect(error: ShutdownContractError) -> None:
    assert set(error.codes) == {"growth"}, error.codes
    first = error.findings[0].message
    assert first.startswith("RegisteredEngine: +1 per cycle (3 cycles); held by list ")
    assert first.endswith(".ALL_ENGINES")
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="registry keeps engines")
def test_buggy_registry_keeps_every_engine() -> None:
    try:
        assert_no_growth(lambda: cycle(RegisteredEngine), cycles=3, warmup=1)
    except ShutdownContractError as error:
        expect(error)
    finally:
        ALL_ENGINES.clear()


def test_fixed_registry_lets_engines_go() -> None:
    assert_no_growth(lambda: cycle(FixedEngine), cycles=3, warmup=1)
