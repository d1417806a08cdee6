"""``collective-hang`` on real gloo ranks: a rank blocked in a collective after its peer was
SIGKILLed is named with the collective and its rank; a rank stuck in a plain exit hang is not.

The ranks die with their root (``PR_SET_PDEATHSIG``), as launchers make them: the check must take
their stacks before the root's. The signal comes once every surviving rank announced the call
(a line written just before it) and its main thread has been asleep in a futex, never woken,
for several readings in a row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import pytest

# The ranks are torch.distributed's (gloo): skipped only where torch is not installed (the
# other Pythons of `make test-pythons` have no CPU build of it).
pytest.importorskip("torch", reason="gloo ranks need torch (extra 'engine')")

import collective_subjects as subjects  # noqa: E402

from pytest_shutdown.helpers.orphans import kill_tree_at
from pytest_shutdown.helpers.tree import TreeProcess, scan_tree
from pytest_shutdown.helpers.tree_launcher import TreeLauncher

#: The survivors hang: the check waits all of it before it reads their stacks.
DEADLINE_S = 3.0
#: Generous for the ranks to start, join the group and block (torch is preloaded).
PHASE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def launcher() -> Iterator[TreeLauncher]:
    with TreeLauncher(preload=("torch", "torch.distributed")) as started:
        yield started


def nothing_left(launcher: TreeLauncher) -> bool:
    return not [p for p in scan_tree(launcher.token, launcher.pid).values() if p.alive]


class Blocked:
    """The phase: every rank of ``ranks`` wrote ``line.format(rank=...)`` and its main thread has
    been in a futex with the same count of voluntary context switches ``needed`` readings in a
    row (blocked in the call, not stepping)."""

    def __init__(self, ranks: Sequence[int], line: str, needed: int = 10) -> None:
        self.ranks, self.line, self.needed = list(ranks), line, needed
        self.last: dict[int, str | None] = {}
        self.streak: dict[int, int] = {}

    def __call__(self, output: str, processes: Sequence[TreeProcess]) -> bool:
        pids = {p.name: p.pid for p in processes}
        ready = True
        for rank in self.ranks:
            pid = pids.get(f"Rank{rank}")
            if pid is None or self.line.format(rank=rank) not in output:
                return False
            switches = _futex_switches(pid)
            if switches is not None and switches == self.last.get(rank):
                self.streak[rank] = self.streak.get(rank, 0) + 1
            else:
                self.streak[rank] = 0
            self.last[rank] = switches
            ready = ready and self.streak[rank] >= self.needed
        return ready


def _futex_switches(pid: int) -> str | None:
    """The main thread's voluntary context switches while it sleeps in a futex, else None."""
    task = f"/proc/{pid}/task/{pid}"
    try:
        with open(f"{task}/wchan") as wchan, open(f"{task}/status") as status:
            if "futex" not in wchan.read():
                return None
            return next(line for line in status if line.startswith("voluntary_ctxt_switches"))
    except (OSError, StopIteration):
        return None


@pytest.mark.parametrize(
    ("operation", "world"),
    [("all_reduce", 2), ("barrier", 2), ("broadcast", 2), ("all_reduce", 4)],
)
def test_a_rank_blocked_in_a_collective_after_its_peer_was_killed_is_a_collective_hang(
    launcher: TreeLauncher, operation: str, world: int
) -> None:
    survivors = [rank for rank in range(world) if rank != 1]
    record = kill_tree_at(
        subjects.ranks_in_collective, args=(operation, world), level="Rank1",
        levels={"Rank1": "Rank1"}, signal="SIGKILL", phase="in_collective",
        phases={"in_collective": Blocked(survivors, f"rank {{rank}} entering {operation}")},
        deadline_s=DEADLINE_S, phase_timeout_s=PHASE_TIMEOUT_S, launcher=launcher,
    )
    codes = Counter(f.code for f in record.findings)
    # the root joining its ranks; each survivor in the collective; the keeper of rank 1's sockets
    assert codes == {"exit-hang": 1, "collective-hang": len(survivors), "orphan-process": 1}, [
        f.message for f in record.findings
    ]
    hangs = {f.details["rank"]: f for f in record.findings if f.code == "collective-hang"}
    assert sorted(hangs) == survivors
    for rank, hang in hangs.items():
        assert hang.details["operation"] == operation
        assert hang.details["name"] == f"Rank{rank}"
        assert f"blocked in {operation}" in hang.message and f"rank {rank})" in hang.message
        assert "distributed_c10d.py" in hang.details["frame"]
        assert "_collective_rank" in hang.details["collective_stack"]
    (root,) = [f for f in record.findings if f.code == "exit-hang"]
    assert root.details["pid"] == record.root_pid
    (keeper,) = [f for f in record.findings if f.code == "orphan-process"]
    assert keeper.details["name"] == "keeper"
    assert nothing_left(launcher)


def test_a_rank_stuck_in_its_exit_without_a_collective_stays_an_exit_hang(
    launcher: TreeLauncher,
) -> None:
    record = kill_tree_at(
        subjects.ranks_stuck_exiting, level="Rank1", levels={"Rank1": "Rank1"},
        signal="SIGKILL", phase="exiting",
        phases={"exiting": Blocked([0], "rank {rank} exiting")},
        deadline_s=DEADLINE_S, phase_timeout_s=PHASE_TIMEOUT_S, launcher=launcher,
    )
    assert [f.code for f in record.findings] == ["exit-hang", "exit-hang"], [
        f.message for f in record.findings
    ]
    root, rank0 = record.findings
    assert root.details["pid"] == record.root_pid
    assert rank0.details["name"] == "Rank0"
    assert "non-daemon thread" in rank0.details["blocked_in"]
    assert "_sleeper" in rank0.details["stacks"]
    assert nothing_left(launcher)
