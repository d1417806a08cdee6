"""A sample of the distributed orphan matrix: the reference tree with a gloo group per EngineCore.

The whole matrix (every level, ranks included, x every signal x every phase) runs in
``benchmarks/distributed_matrix.py``, which prints its wall time against the 90 s target; here a
sample keeps ``make test`` fast: SIGKILL and SIGTERM (SIGINT takes SIGTERM's path) to each rank
while rank 0 waits inside a collective for a straggling rank 1 (phase ``in_collective``), and
SIGKILL to the levels above the ranks in that phase.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown.engine.distributed_tree import (
    DISTRIBUTED_LEVELS,
    DISTRIBUTED_PHASES,
    distributed_matrix_config,
)
from pytest_shutdown.engine.frontend import serve_frontend

VICTIMS = {"frontend": "Frontend", "engine_core": "EngineCore_DP0", "worker": "Worker_TP0",
           "rank0": "Worker_TP0", "rank1": "Worker_TP1"}


def _kill(kill_tree: Any, orphan_cell: Any, **config: Any) -> Any:
    record = kill_tree(
        serve_frontend, args=(distributed_matrix_config(**config),),
        levels=DISTRIBUTED_LEVELS, phases=DISTRIBUTED_PHASES,
    )
    assert record.died
    assert record.victim_name == VICTIMS[orphan_cell.level]
    assert record.processes_at_signal == 7  # frontend, 2 EngineCores, 4 ranks
    return record


@pytest.mark.orphan_matrix(
    level=["rank0", "rank1"], signal=["SIGKILL", "SIGTERM"], phase=["in_collective"]
)
def test_every_rank_dies_or_lets_its_peers_go_whatever_kills_it_mid_collective(
    kill_tree: Any, orphan_cell: Any
) -> None:
    record = _kill(kill_tree, orphan_cell)
    assert record.root_exitcode == 1  # a rank's death is an engine's death: the frontend stops


@pytest.mark.orphan_matrix(
    level=["frontend", "engine_core"], signal=["SIGKILL"], phase=["in_collective"]
)
def test_the_levels_above_the_ranks_take_them_along_mid_collective(
    kill_tree: Any, orphan_cell: Any
) -> None:
    _kill(kill_tree, orphan_cell)


@pytest.mark.orphan_matrix(level=["engine_core"], signal=["SIGKILL", "SIGTERM"], phase=["busy"])
def test_with_the_dp_group_on_a_dead_or_stopped_dp_rank_takes_the_whole_tree_along(
    kill_tree: Any, orphan_cell: Any
) -> None:
    """The EngineCores in a DP group of their own too: no rank stays in the DP all-reduce.

    (``benchmarks/distributed_matrix.py --dp-process-group gloo`` runs all 60 cells so.)
    """
    _kill(kill_tree, orphan_cell, dp_process_group="gloo")
