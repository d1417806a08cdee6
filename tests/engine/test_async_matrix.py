"""The async front end as a level of the orphan matrix: SIGKILL it in every phase.

``AsyncFrontend`` (``asyncio.run`` of an ``AsyncLLM``) over two EngineCores: killed while they
load their model (``starting``), while requests are in flight (``busy``) and while its own
``aclose()`` waits for their slow teardown (``shutting_down``), no EngineCore outlives it (their
death pipe, parent watch and PDEATHSIG). SIGTERM takes the graceful path: the tree exits 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown.engine.async_frontend import (
    ASYNC_LEVELS,
    ASYNC_PHASES,
    async_matrix_config,
    serve_async_frontend,
)


@pytest.mark.long_running(12)  # spawn: every EngineCore imports torch
@pytest.mark.orphan_matrix(
    level=["frontend"], signal=["SIGKILL"], phase=["starting", "busy", "shutting_down"]
)
def test_no_engine_core_outlives_a_sigkilled_async_frontend_in_any_phase(
    kill_tree: Any, orphan_cell: Any
) -> None:
    record = kill_tree(
        serve_async_frontend,
        args=(async_matrix_config(),),
        levels=ASYNC_LEVELS,
        phases=ASYNC_PHASES,
    )
    assert record.died
    assert record.victim_name == "AsyncFrontend"
    assert record.processes_at_signal >= 3  # the front end and its two EngineCores


@pytest.mark.long_running(12)
@pytest.mark.orphan_matrix(
    level=["frontend"], signal=["SIGTERM"], phase=["starting", "ready", "busy"]
)
def test_sigterm_closes_the_async_frontend_gracefully(kill_tree: Any, orphan_cell: Any) -> None:
    """A SIGTERM while the EngineCores load abandons the start-up (exit code 1) within the
    processes' timeout, not after the model's 30 s load; later it is a clean close (0)."""
    record = kill_tree(
        serve_async_frontend,
        args=(async_matrix_config(),),
        levels=ASYNC_LEVELS,
        phases=ASYNC_PHASES,
    )
    assert record.died
    assert record.root_exitcode == (1 if orphan_cell.phase == "starting" else 0)
    assert record.duration_s < 10.0
