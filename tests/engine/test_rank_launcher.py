"""``serve_ranks`` (a head hosting the store, and its gloo ranks): whatever is killed, all end."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown.engine.rank_launcher import RANK_LEVELS, serve_ranks

VICTIMS = {"head": "RankLauncher", "rank0": "Rank0", "rank1": "Rank1"}


@pytest.mark.orphan_matrix(
    level=["head", "rank0", "rank1"], signal=["SIGKILL", "SIGTERM"],
    phase=["in_collective"],
)
def test_killing_any_rank_or_the_head_mid_collective_ends_every_rank(
    kill_tree: Any, orphan_cell: Any
) -> None:
    record = kill_tree(serve_ranks, levels=RANK_LEVELS, deadline_s=8.0)
    assert record.died
    assert record.victim_name == VICTIMS[orphan_cell.level]
    assert record.processes_at_signal == 3
