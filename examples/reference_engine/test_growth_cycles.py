"""Growth over cycles on the reference engine: the engine fixtures' cycle count, the
``shutdown_cycles`` marker, and a second engine in the same process.

An engine fixture given a cycle count (indirect parametrization) builds, uses and shuts down
that many engines under ``assert_no_growth`` before the test gets its own (the reference
``ReferenceLLM`` and ``EngineCore`` pass 10: ``tests/engine/test_growth_cycles.py``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown import assert_no_growth, assert_second_engine_clean  # noqa: E402
from pytest_shutdown.engine import EngineConfig, EngineCore, ReferenceLLM  # noqa: E402


@pytest.mark.parametrize("engine_core", [3], indirect=True)
def test_engine_core_passes_three_cycles(engine_core: EngineCore) -> None:
    # the fixture built, used and shut down 2 + 3 EngineCores before this one: nothing grew
    assert len(engine_core.generate([1, 2, 3], max_tokens=2)) == 2


def test_build_use_shut_down_leaves_nothing_behind(engine_config: EngineConfig) -> None:
    def cycle() -> None:
        with ReferenceLLM(engine_config, multiprocess=False) as llm:
            llm.generate(["a prompt", "another"], max_tokens=3)

    assert_no_growth(cycle, cycles=3, warmup=1)


@pytest.mark.shutdown_cycles(3)
def test_generate_repeated_in_one_process(engine_core: EngineCore) -> None:
    # the engine is set up once; generating with it again and again must not grow anything
    engine_core.generate([4, 5, 6], max_tokens=2)


def test_a_second_llm_in_the_same_process(engine_config: EngineConfig) -> None:
    assert_second_engine_clean(
        lambda: ReferenceLLM(engine_config),
        lambda llm: llm.generate("hello", max_tokens=2),
    )
