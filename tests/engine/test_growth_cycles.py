"""The reference engine passes 10 growth cycles; the same check catches a leak put into it.

The clean side runs through the engine fixtures' cycle count (indirect parametrization): the
fixture builds, uses and shuts down 2 + 10 engines under ``assert_no_growth`` before the test
gets its own. The buggy side keeps every ReferenceLLM in a list after its shutdown.
"""

from __future__ import annotations

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth
from pytest_shutdown.engine import EngineConfig, EngineCore, ReferenceLLM

#: Each check below builds 12 engines (the box may be loaded): a generous bound, not a speed.
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("reference_llm", [10], indirect=True)
def test_reference_llm_passes_ten_cycles(reference_llm: ReferenceLLM) -> None:
    assert reference_llm.generate("hello world", max_tokens=2)[0].token_ids


@pytest.mark.parametrize("engine_core", [10], indirect=True)
def test_engine_core_passes_ten_cycles(engine_core: EngineCore) -> None:
    assert len(engine_core.generate([1, 2, 3], max_tokens=2)) == 2


KEPT: list[ReferenceLLM] = []


def test_a_reference_llm_kept_after_shutdown_is_growth(engine_config: EngineConfig) -> None:
    def cycle() -> None:
        with ReferenceLLM(engine_config, multiprocess=False) as llm:
            llm.generate("hello", max_tokens=2)
        KEPT.append(llm)  # the bug: a registry of every engine ever built

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, cycles=3, warmup=1)
    finally:
        KEPT.clear()

    first, second = info.value.findings[:2]
    # the outermost engine type first, held by the registry; its parts held by it
    assert first.message == f"ReferenceLLM: +1 per cycle (3 cycles); held by list {__name__}.KEPT"
    assert second.message.endswith("; held by ReferenceLLM object")
