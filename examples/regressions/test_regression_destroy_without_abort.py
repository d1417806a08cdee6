"""SGLang #39560: tearing a process group down with a dead peer, destroying instead of aborting.

``destroy_process_group`` is collective where it matters (nccl's ``ncclCommDestroy``; the
barrier teardowns put before it): with a peer already gone it waits for a rank that will never
come. SGLang's scheduler moved from destroying to aborting the group "because a peer is already
gone". Here rank 1 dies while the ranks step; rank 0's next step fails, and the buggy teardown
synchronises with every rank (no deadline) before ``destroy_process_group``: it never ends, and
the checker says where (``collective-hang``, ``store.wait`` inside the teardown). Fixed: a rank
whose peer is gone aborts the group (torch's ``_abort_process_group``) and exits.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import RANK_LEVELS, RankFaults, serve_ranks

DEADLINE_S = 6.0
CELL = {"level": "rank1", "signal": "SIGKILL", "phase": "busy"}


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="destroy waits for the dead")
def test_destroying_the_group_with_a_dead_peer_never_ends(kill_tree: Any) -> None:
    try:
        kill_tree(serve_ranks, kwargs={"faults": RankFaults(destroy_without_abort=True)},
                  levels=RANK_LEVELS, deadline_s=DEADLINE_S, **CELL)
    except ShutdownContractError as error:
        assert "collective-hang" in error.codes, error.codes
        hang = next(f for f in error.findings if f.code == "collective-hang")
        assert hang.details["rank"] == 0
        assert "_synchronise_then_destroy" in hang.details["collective_stack"]
        raise


def test_aborting_the_group_when_a_peer_is_gone_ends_the_rank(kill_tree: Any) -> None:
    record = kill_tree(serve_ranks, levels=RANK_LEVELS, deadline_s=DEADLINE_S, **CELL)
    assert record.root_exitcode == 1
