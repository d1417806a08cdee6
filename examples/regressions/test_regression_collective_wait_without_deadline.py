"""vLLM #32136: a rank whose peer died waits in the store forever (no deadline).

A head hosts the group's TCPStore; its ranks synchronise each step through the store before
their ``all_reduce``. When rank 1 dies, rank 0 waits in ``store.wait`` for rank 1's key: the
store lives on in the head, so nothing ever answers, and with no deadline (and its SIGTERM
handler unable to run while the main thread is inside C++) rank 0 never ends; the head, which
waits for its ranks, never exits either. The checker names the hang: ``collective-hang`` with
the rank, the operation and the stack, beside the head's ``exit-hang``. Fixed: every store wait
has a deadline and a watchdog ends a rank stuck in one after a stop; the rank then aborts its
group instead of the barrier-and-destroy teardown.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import RANK_LEVELS, RankFaults, serve_ranks

DEADLINE_S = 6.0
CELL = {"level": "rank1", "signal": "SIGKILL", "phase": "in_collective"}


def expect_collective_hang(error: ShutdownContractError, where: str) -> None:
    """Re-raise when rank 0 is named blocked in the store wait ``where``; else fail the xfail."""
    assert "collective-hang" in error.codes, error.codes
    hang = next(f for f in error.findings if f.code == "collective-hang")
    assert hang.details["rank"] == 0
    assert hang.details["operation"] == "store.wait"
    assert where in hang.details["collective_stack"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="waits for a dead peer")
def test_a_rank_waiting_without_a_deadline_outlives_its_dead_peer(kill_tree: Any) -> None:
    try:
        kill_tree(serve_ranks, kwargs={"faults": RankFaults(untimed_waits=True)},
                  levels=RANK_LEVELS, deadline_s=DEADLINE_S, **CELL)
    except ShutdownContractError as error:
        expect_collective_hang(error, "_wait_for_peers")


def test_a_rank_whose_waits_have_deadlines_ends_after_its_peer(kill_tree: Any) -> None:
    record = kill_tree(serve_ranks, levels=RANK_LEVELS, deadline_s=DEADLINE_S, **CELL)
    assert record.root_exitcode == 1  # a rank failed: the head reports it
