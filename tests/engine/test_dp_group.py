"""The DP ranks' process group: EngineCore_DP{i} all-reduce their state each step, in lockstep.

Real processes and real signals; the bounds only catch a hang (a rank that never got out).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from engine_proc_testing import events, fast_config, wait_for

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import FinishReason
from pytest_shutdown.engine.distributed import STORE_HOST, CollectiveWatchdog
from pytest_shutdown.engine.dp_group import dp_group_spec
from pytest_shutdown.engine.faults import ChildFaults
from pytest_shutdown.engine.processes import EngineProcManager, EngineStartupError

#: Far beyond every deadline of ``dp_config()``: reaching it means a rank hung.
HANG_S = 30.0


def dp_config(**changes: object) -> EngineConfig:
    """Two EngineCores in a gloo DP group, deadlines scaled down to seconds."""
    base: dict[str, object] = dict(
        data_parallel_size=2, dp_process_group="gloo", store_timeout_s=10.0,
        collective_timeout_s=10.0, barrier_timeout_s=2.0, collective_abort_grace_s=0.3,
    )
    base.update(changes)
    return fast_config(**base)


@contextlib.contextmanager
def _stepping_pair(config: EngineConfig, log: str) -> Iterator[EngineProcManager]:
    """A dp=2 engine whose two ranks both step (a long request each), shut down at the end."""
    manager = EngineProcManager(config, lifecycle_log=log)
    try:
        for rank in (0, 1):
            manager.add_request(f"r{rank}", [1, 2, 3], 1_000_000, rank=rank)
        for _ in range(4):
            manager.outputs.get(timeout=HANG_S)
        yield manager
    finally:
        for proc in manager.processes:  # a rank a test stopped must not hold up the shutdown
            if proc.pid is not None and proc.exitcode is None:
                os.kill(proc.pid, signal.SIGCONT)
        manager.shutdown(0)


@pytest.fixture
def busy_pair(log: str) -> Iterator[EngineProcManager]:
    """A dp=2 engine whose two ranks both step, with ``dp_config()``'s short deadlines."""
    with _stepping_pair(dp_config(), log) as manager:
        yield manager


@pytest.fixture
def patient_pair(log: str) -> Iterator[EngineProcManager]:
    """A stepping dp=2 engine whose only short wait is gloo's noticing a dead peer.

    When a rank dies the manager's monitor shuts the others down (as vLLM's engine client does):
    SIGTERM, then SIGKILL after ``default_process_timeout_s``; a rank told to stop while inside
    a collective is ended by its watchdog after ``collective_abort_grace_s``. With
    ``dp_config()``'s 3 s and 0.3 s, a survivor that a loaded machine did not run for that long
    was killed (or ended by its watchdog) before it logged its failed all-reduce: the test
    measured the machine's speed. Here both are far beyond anything a busy machine takes, and
    the collective timeout too, so that only a peer seen gone can fail the all-reduce.
    """
    config = dp_config(
        default_process_timeout_s=HANG_S, collective_abort_grace_s=HANG_S,
        collective_timeout_s=4 * HANG_S,
    )
    with _stepping_pair(config, log) as manager:
        yield manager


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``/proc/PID/stat``), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


class _FutexStreak:
    """True once thread ``pid`` (a process's main thread) was seen asleep in a futex with the
    same count of voluntary context switches ``needed`` readings in a row: blocked, not woken."""

    def __init__(self, pid: int, needed: int = 10) -> None:
        self.pid, self.needed = pid, needed
        self.last: str | None = None
        self.streak = 0

    def __call__(self) -> bool:
        task = f"/proc/{self.pid}/task/{self.pid}"
        try:
            with open(f"{task}/wchan") as wchan, open(f"{task}/status") as status:
                in_futex = "futex" in wchan.read()
                switches = next(
                    line for line in status if line.startswith("voluntary_ctxt_switches")
                )
        except (OSError, StopIteration):
            in_futex, switches = False, None
        if in_futex and switches is not None and switches == self.last:
            self.streak += 1
        else:
            self.streak = 0
        self.last = switches if in_futex else None
        return self.streak >= self.needed


def by_rank(log: str, name: str) -> dict[int, dict]:
    return {e["dp_rank"]: e for e in events(log, name)}


# -- the spec (no processes) -------------------------------------------------------------------
def test_no_dp_group_unless_asked_for_and_more_than_one_rank() -> None:
    assert dp_group_spec(EngineConfig(data_parallel_size=2)) is None  # off by default
    assert dp_group_spec(EngineConfig(dp_process_group="gloo")) is None  # dp == 1
    config = EngineConfig(data_parallel_size=2, dp_process_group="auto", platform="cpu")
    spec = dp_group_spec(config)
    assert spec is not None and spec.backend == "gloo" and spec.port > 0


def test_the_dp_group_takes_nccl_on_a_cuda_device_where_torch_has_it() -> None:
    """The GPU path's choice, against fakes (no GPU here): ``select_backend``'s rules."""
    config = EngineConfig(data_parallel_size=2, dp_process_group="auto", device="cuda")
    spec = dp_group_spec(config, nccl_available=lambda: True)
    assert spec is not None and spec.backend == "nccl"
    spec = dp_group_spec(config, nccl_available=lambda: False)
    assert spec is not None and spec.backend == "gloo"
    cpu = EngineConfig(data_parallel_size=2, dp_process_group="nccl", platform="cpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        dp_group_spec(cpu, nccl_available=lambda: True)


def test_a_bad_dp_process_group_is_rejected_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"EngineConfig.dp_process_group: unknown value 'mpi'"):
        EngineConfig(dp_process_group="mpi")


def test_the_watchdog_leaves_a_rank_alone_while_its_collectives_complete() -> None:
    """A stopping rank draining in lockstep is inside one collective after another: not stuck."""

    class Group:
        in_collective = threading.Event()
        steps = 0

    group = Group()
    exits: list[int] = []
    dog = CollectiveWatchdog(group, 0.2, exits.append)  # type: ignore[arg-type]
    try:
        group.in_collective.set()
        dog.stop(0)
        for _ in range(12):  # 0.6 s of back-to-back collectives, three times the grace
            time.sleep(0.05)
            group.steps += 1
        assert exits == []
        wait_for(lambda: exits, 10.0, "the watchdog to end the rank once no collective completes")
        assert exits == [0]
    finally:
        dog.close()


# -- real ranks --------------------------------------------------------------------------------
def test_the_dp_ranks_form_a_group_step_in_it_and_destroy_it_on_shutdown(log: str) -> None:
    manager = EngineProcManager(dp_config(), lifecycle_log=log)
    try:
        manager.add_request("a", [1, 2, 3], 4, rank=0)
        manager.add_request("b", [4, 5], 2, rank=1)
        finished: set[str] = set()
        deadline = time.monotonic() + HANG_S
        while len(finished) < 2 and time.monotonic() < deadline:
            output = manager.outputs.get(timeout=HANG_S)
            if output.finished:
                finished.add(output.request_id)
        assert finished == {"a", "b"}
        assert manager.dp_group is not None
        port = manager.dp_group.port
    finally:
        outcome = manager.shutdown(5)
    assert outcome is not None and outcome.exitcodes == {"EngineCore_DP0": 0, "EngineCore_DP1": 0}
    joined = by_rank(log, "dp_group_joined")
    assert sorted(joined) == [0, 1] and {e["backend"] for e in joined.values()} == {"gloo"}
    left = by_rank(log, "dp_group_left")
    assert {rank: e["ending"] for rank, e in left.items()} == {0: "destroyed", 1: "destroyed"}
    # Lockstep: both ranks ran the same all-reduces, at least one per step of the longer request.
    assert left[0]["steps"] == left[1]["steps"] >= 4
    with socket.socket() as sock:  # rank 0's store is gone with it: nothing listens on its port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((STORE_HOST, port))


def test_a_stop_told_to_one_rank_stops_the_group_and_it_is_destroyed(
    busy_pair: EngineProcManager, log: str
) -> None:
    rank0, rank1 = busy_pair.processes
    assert rank1.pid is not None
    os.kill(rank1.pid, signal.SIGTERM)
    rank0.join(HANG_S)
    assert rank0.exitcode == 0  # it stopped because its peer did, not because it was killed
    assert events(log, "dp_stop_from_peer")[0]["dp_rank"] == 0
    wait_for(lambda: len(by_rank(log, "dp_group_left")) == 2, HANG_S, "both ranks to leave")
    left = by_rank(log, "dp_group_left")
    assert {rank: e["ending"] for rank, e in left.items()} == {0: "destroyed", 1: "destroyed"}


@pytest.mark.parametrize("where", ["anywhere", "blocked-in-all-reduce"])
@pytest.mark.parametrize("killed", [0, 1], ids=["store-host-rank0", "rank1"])
def test_a_sigkilled_dp_rank_makes_its_peer_leave_the_collective_and_exit(
    patient_pair: EngineProcManager, log: str, killed: int, where: str
) -> None:
    """The survivor's all-reduce fails (gloo sees the peer's sockets close) whether it was inside
    it, blocked waiting for the peer, or entered it after the peer was gone; it leaves the group
    by the abort and exits (vLLM's DP ranks: never the collective destroy, never a hang)."""
    victim = patient_pair.processes[killed]
    survivor_rank = 1 - killed
    survivor = patient_pair.processes[survivor_rank]
    assert victim.pid is not None and survivor.pid is not None
    if where == "blocked-in-all-reduce":
        # The victim stopped, the survivor finishes at most the step the victim took part in
        # and then waits for it inside the all-reduce (its main thread asleep, never woken).
        os.kill(victim.pid, signal.SIGSTOP)
        wait_for(lambda: _state(victim.pid) == "T", HANG_S, f"rank {killed} stopped")
        wait_for(
            _FutexStreak(survivor.pid), HANG_S, f"rank {survivor_rank} blocked in the all-reduce",
            poll=0.01,
        )
    os.kill(victim.pid, signal.SIGKILL)
    survivor.join(3 * HANG_S)
    assert survivor.exitcode is not None, f"{survivor.name} hung after its DP peer was SIGKILLed"
    assert events(log, "dp_collective_abandoned") == []  # it got out by itself, not the watchdog
    (failed,) = events(log, "dp_collective_failed")
    assert failed["dp_rank"] == survivor_rank
    # Gloo saw the peer's sockets close (reset, closed by peer), not its deadline run out.
    assert "timed out" not in failed["error"].lower(), failed["error"]
    left = by_rank(log, "dp_group_left")
    assert left[survivor_rank]["ending"] == "aborted"  # a peer gone: abort, never the destroy


def test_a_rank_blocked_in_the_dp_collective_gets_out_when_told_to_stop(
    busy_pair: EngineProcManager, log: str
) -> None:
    """Its peer is alive but never comes (stopped): the watchdog ends it after the grace."""
    rank0, rank1 = busy_pair.processes
    assert rank0.pid is not None and rank1.pid is not None
    os.kill(rank1.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _state(rank1.pid) == "T", HANG_S, "rank 1 stopped")
        # Rank 0 finishes at most the step rank 1 already took part in, then waits for it in
        # the all-reduce: its main thread asleep in a futex, and never woken (a stepping rank's
        # main thread wakes every step), over several readings in a row.
        still = _FutexStreak(rank0.pid)
        wait_for(still, HANG_S, "rank 0 blocked in the all-reduce", poll=0.01)
        os.kill(rank0.pid, signal.SIGTERM)
        rank0.join(HANG_S)
    finally:
        os.kill(rank1.pid, signal.SIGCONT)
    assert rank0.exitcode == 0, "EngineCore_DP0 stayed blocked in the DP all-reduce"
    (abandoned,) = events(log, "dp_collective_abandoned")
    assert abandoned["dp_rank"] == 0


def test_a_rank_waiting_in_init_for_a_peer_that_failed_to_start_gets_out(log: str) -> None:
    """Rank 1 fails (0.5 s late) before it joins; rank 0 waits in ``init_process_group`` (20 s
    deadline) until the manager's SIGTERM, which its watchdog turns into an exit after the grace.
    """
    config = dp_config(store_timeout_s=20.0, collective_timeout_s=20.0)
    started = time.monotonic()
    with pytest.raises(EngineStartupError, match="injected startup failure in EngineCore_DP1"):
        faults = ChildFaults(fail_startup_ranks=(1,), fail_startup_after_s=0.5)
        EngineProcManager(config, lifecycle_log=log, faults=faults)
    assert time.monotonic() - started < 20.0, "rank 0 sat out its init deadline"
    (abandoned,) = events(log, "dp_collective_abandoned")
    assert abandoned["dp_rank"] == 0


def test_a_drain_runs_in_lockstep_and_the_idle_rank_is_not_taken_for_stuck(log: str) -> None:
    """Rank 1 is done at once; it stays in one all-reduce after another while rank 0 drains its
    request (about 0.7 s, over twice the abort grace): the drain completes, the group is destroyed.
    """
    config = dp_config(shutdown_timeout=HANG_S, step_delay_s=0.05)
    manager = EngineProcManager(config, lifecycle_log=log)
    try:
        manager.add_request("long", [1, 2], 14, rank=0)
        manager.outputs.get(timeout=HANG_S)
    finally:
        outcome = manager.shutdown(HANG_S)
    assert outcome is not None and outcome.exitcodes == {"EngineCore_DP0": 0, "EngineCore_DP1": 0}
    outputs = []
    while not manager.outputs.empty():
        outputs.append(manager.outputs.get_nowait())
    assert outputs and outputs[-1].finish_reason == FinishReason.LENGTH  # drained, not aborted
    assert events(log, "dp_collective_abandoned") == []
    left = by_rank(log, "dp_group_left")
    assert {rank: e["ending"] for rank, e in left.items()} == {0: "destroyed", 1: "destroyed"}
