"""Distributed teardown: the reference tree with a gloo group per EngineCore, and process groups.

The orphan matrix gains the ranks of a group as levels (``rank0``, ``rank1``) and the phase
``in_collective``: rank 0 waits inside an ``all_reduce`` for a straggling rank 1 when the signal
comes. Whatever is killed, every rank must exit within the deadline. A process group a test
makes must be destroyed (or aborted) by its end: ``assert_process_group_destroyed``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from pytest_shutdown import assert_process_group_destroyed
from pytest_shutdown.engine import (
    DISTRIBUTED_LEVELS,
    DISTRIBUTED_PHASES,
    distributed_matrix_config,
    serve_frontend,
)


@pytest.mark.orphan_matrix(level=["rank1"], signal=["SIGKILL"], phase=["in_collective"])
def test_every_rank_ends_when_one_dies_mid_collective(kill_tree: Any) -> None:
    kill_tree(serve_frontend, args=(distributed_matrix_config(),),
              levels=DISTRIBUTED_LEVELS, phases=DISTRIBUTED_PHASES)


def test_a_group_is_destroyed_after_use() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(1))
    finally:
        dist.destroy_process_group()
    assert_process_group_destroyed("the test")

