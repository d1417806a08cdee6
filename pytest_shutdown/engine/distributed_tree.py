"""The reference tree with a process group: its configuration, rank levels and phases.

``serve_frontend(distributed_matrix_config())`` runs frontend → ``EngineCore_DP{i}`` →
``Worker_TP{j}`` where the TP workers of each EngineCore form a gloo group (over a store their
EngineCore hosts) and run one collective per engine step. The orphan matrix over it kills every
level, each rank of a group included (``rank0``, ``rank1``), in every phase, the phase
``in_collective`` included (rank 0 waits inside a collective for a straggling rank 1).
"""

from __future__ import annotations

from typing import Any

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.frontend import REFERENCE_LEVELS, WholeTreeLoading, matrix_config

#: The levels of the distributed tree: the reference levels, and each rank of a TP group.
DISTRIBUTED_LEVELS = {**REFERENCE_LEVELS, "rank0": "Worker_TP0", "rank1": "Worker_TP1"}
#: Phases beyond ``report_phase``'s own lines (``in_collective`` is announced by rank 0).
DISTRIBUTED_PHASES = {"starting": WholeTreeLoading(4)}
#: Every phase of the distributed tree's matrix.
DISTRIBUTED_PHASE_NAMES = ("starting", "ready", "busy", "in_collective", "shutting_down")


def distributed_matrix_config(**changes: Any) -> EngineConfig:
    """``matrix_config()`` with a gloo group per EngineCore and deadlines scaled down to seconds.

    The teardown barrier and the abort grace fit well inside the EngineCore's 2 s budget for
    its workers; the collective timeout bounds a collective whose peer never comes.
    """
    base: dict[str, Any] = dict(
        process_group="gloo",
        store_timeout_s=10.0,
        collective_timeout_s=5.0,
        barrier_timeout_s=0.5,
        collective_abort_grace_s=0.3,
    )
    base.update(changes)
    return matrix_config(**base)
