"""The reference tree with a gloo group per EngineCore's TP workers, for the orphan matrix."""

from __future__ import annotations

from typing import Any

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.frontend import REFERENCE_LEVELS, REFERENCE_PHASES, matrix_config

DISTRIBUTED_LEVELS = {**REFERENCE_LEVELS, "rank0": "Worker_TP0", "rank1": "Worker_TP1"}
DISTRIBUTED_PHASES = {**REFERENCE_PHASES}


def distributed_matrix_config(**changes: Any) -> EngineConfig:
    """``matrix_config()`` with a gloo group per EngineCore and deadlines scaled down to seconds
    (barrier and abort grace well inside the EngineCore's 2 s budget for its workers)."""
    base: dict[str, Any] = dict(
        process_group="gloo",
        store_timeout_s=10.0,
        collective_timeout_s=5.0,
        barrier_timeout_s=0.5,
        collective_abort_grace_s=0.3,
    )
    base.update(changes)
    return matrix_config(**base)
