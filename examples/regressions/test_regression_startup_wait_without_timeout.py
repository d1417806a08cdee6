"""vLLM PR #44751: an engine start-up given up mid-load orphans the GPU workers (~40 GB each).

The launcher gives up on a start-up (a timeout, or it is killed) while the workers are still
loading the model. The EngineCore waited for its workers with no deadline and armed its
lifelines only once start-up was done; the workers watched their parent only after loading. So
nothing noticed the launcher's death until the load finished, if ever. Fixed: every wait of the
start-up has a deadline and is interruptible, and every lifeline is armed before loading.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import REFERENCE_LEVELS, REFERENCE_PHASES, ChildFaults, serve_frontend

DEADLINE_S = 5.0
CELL = {"level": "frontend", "signal": "SIGKILL", "phase": "starting"}


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    assert {"Worker_TP0", "Worker_TP1"} <= {f.details["name"] for f in error.findings}
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="workers keep loading")
def test_a_start_up_without_deadlines_orphans_its_loading_workers(kill_tree: Any) -> None:
    try:
        kill_tree(serve_frontend, kwargs={"faults": ChildFaults(lifeline_after_startup=True)},
                  levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES, deadline_s=DEADLINE_S,
                  **CELL)
    except ShutdownContractError as error:
        expect("orphan-process", error)


def test_an_interruptible_start_up_takes_its_loading_workers_down(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES, **CELL)
