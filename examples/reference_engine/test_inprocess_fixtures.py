"""The plugin's in-process engine fixtures: ``reference_renderer`` and ``engine_core``.

Each fixture shuts its engine down in teardown and checks the contracts there (idempotent
shutdown, threads ended, ``gc.get_freeze_count()`` back where it was), so these tests only do
their own part. ``@pytest.mark.engine(**fields)`` changes the EngineConfig they are built from.
"""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown import assert_nonblocking_shutdown  # noqa: E402
from pytest_shutdown.engine import (  # noqa: E402
    EngineCore,
    ReferenceRenderer,
)


@pytest.mark.engine(renderer_num_workers=3)
def test_renderer_from_the_fixture(reference_renderer: ReferenceRenderer) -> None:
    ids = reference_renderer.tokenize("shutdown").result(timeout=10)
    assert reference_renderer.detokenize(ids).result(timeout=10) == "shutdown"
    # the fixture's teardown shuts it down three times and checks each cleanup ran once


def test_a_renderer_shutdown_never_waits_for_busy_pools(
    reference_renderer: ReferenceRenderer,
) -> None:
    assert_nonblocking_shutdown(reference_renderer, budget=0.5)


@pytest.mark.engine(kv_cache_bytes=1 << 16)
def test_engine_core_generates_and_restores_the_freeze_count(engine_core: EngineCore) -> None:
    before = gc.get_freeze_count()
    tokens = engine_core.generate([1, 2, 3], max_tokens=4)
    assert len(tokens) == 4

    engine_core.shutdown()
    engine_core.shutdown()  # idempotent

    assert engine_core.is_shut_down
    assert engine_core.model is None and engine_core.kv_cache is None  # device memory released
    assert gc.get_freeze_count() <= before  # the startup heap it froze is unfrozen
