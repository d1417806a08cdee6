"""``serve_ranks``: a head process hosting a group's store, and its ranks, for distributed bugs.

The shape of a DP head with headless ranks (vLLM's multi-node DP, torchrun's agent): the head
hosts the ``TCPStore`` and forks ``world_size`` ranks (``Rank{r}``); it forwards SIGTERM/SIGINT
to them and, once one rank has ended, tells the others to stop; it never kills a rank. Each rank
joins a gloo group and steps: it publishes ``step/<n>/<rank>`` in the store, waits for its
peers' keys, then runs an ``all_reduce``. Phases: ``ready``, ``busy``, ``in_collective`` (rank 0
waits in the store for a straggling last rank).

The faults put back two production bugs: ``untimed_waits`` (vLLM #32136: store waits without a
deadline nor a watchdog, so a rank whose peer died waits forever) and ``destroy_without_abort``
(SGLang #39560: teardown always synchronises with every rank before ``destroy_process_group``,
without a deadline, even with a peer gone).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

import torch.distributed as dist

from pytest_shutdown._os.phases import report_phase, wanted_phase
from pytest_shutdown.engine.distributed import (
    CollectiveWatchdog,
    GroupDeadlines,
    RankGroup,
    free_port,
    host_store,
)
from pytest_shutdown.engine.lifeline import (
    EXIT_PARENT_GONE,
    on_stop_signals,
    set_parent_death_signal,
    set_process_name,
)
from pytest_shutdown.engine.stop_flag import SignalStop

#: The levels of the head's tree for ``kill_tree_at``.
RANK_LEVELS = {"head": "root", "rank0": "Rank0", "rank1": "Rank1"}
#: A wait "without a deadline": what an untimed store wait amounts to.
UNTIMED = timedelta(days=1)
#: How long the last rank straggles before each step in phase ``in_collective``.
STRAGGLE_S = 30.0
STEP_PAUSE_S = 0.01
EXIT_PEER_GONE = 4


@dataclass(frozen=True)
class RankFaults:
    """The production bugs the regressions put back (each off by default)."""

    untimed_waits: bool = False
    destroy_without_abort: bool = False


def serve_ranks(
    world_size: int = 2,
    *,
    deadlines: GroupDeadlines | None = None,
    faults: RankFaults | None = None,
    abort_grace_s: float = 0.3,
) -> int:
    """Run the head: host the store, start the ranks, wait for them; the worst exit code."""
    deadlines = deadlines or GroupDeadlines(store_timeout_s=2.0, collective_timeout_s=5.0,
                                            barrier_timeout_s=0.5)
    faults = faults or RankFaults()
    set_process_name("RankLauncher")
    port = free_port()
    ctx = multiprocessing.get_context("fork")
    ranks: list[BaseProcess] = [
        ctx.Process(  # type: ignore[attr-defined]
            target=_rank_main, name=f"Rank{r}", daemon=False,
            args=(r, world_size, port, os.getpid(), deadlines, faults, abort_grace_s),
        )
        for r in range(world_size)
    ]
    for proc in ranks:
        proc.start()
    store = host_store(port, world_size, deadlines)  # after the forks: no rank inherits it

    def forward(signum: int, frame: object) -> None:
        for proc in ranks:
            if proc.pid is not None and proc.exitcode is None:
                try:
                    os.kill(proc.pid, signum)
                except OSError:
                    pass

    on_stop_signals(forward)
    try:
        # Each rank must end by itself: a rank deaf to the SIGTERM is the rank's bug.
        told = False
        while any(proc.exitcode is None for proc in ranks):
            if not told and any(proc.exitcode is not None for proc in ranks):
                forward(signal.SIGTERM, None)
                told = True
            ranks[0].join(0.05)
    finally:
        del store
    return 1 if any(proc.exitcode for proc in ranks) else 0


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    head_pid: int,
    deadlines: GroupDeadlines,
    faults: RankFaults,
    abort_grace_s: float,
) -> None:
    set_process_name(f"Rank{rank}")
    set_parent_death_signal(signal.SIGTERM)
    rank_proc = _Rank(rank, world_size, port, head_pid, deadlines, faults, abort_grace_s)
    raise SystemExit(rank_proc.run())


class _Rank:
    def __init__(
        self,
        rank: int,
        world_size: int,
        port: int,
        head_pid: int,
        deadlines: GroupDeadlines,
        faults: RankFaults,
        abort_grace_s: float,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.faults = faults
        self.head_pid = head_pid
        self.stop = SignalStop()  # set by a signal handler: no threading.Event
        self.wait_timeout = UNTIMED if faults.untimed_waits else timedelta(
            seconds=deadlines.store_timeout_s
        )
        self.group = RankGroup(rank, world_size, port, deadlines=deadlines)
        self.abort_grace_s = abort_grace_s
        self.peer_gone = False
        self.phase = wanted_phase()

    def on_signal(self, signum: int, frame: object) -> None:
        self.stop.set()

    def run(self) -> int:
        on_stop_signals(self.on_signal)
        watchdog = None
        sig_fds: tuple[int, int] | None = None
        if not (self.faults.untimed_waits or self.faults.destroy_without_abort):
            # The fix: a rank stuck in a wait after a stop still ends (its abort path).
            sig_fds = os.pipe()
            os.set_blocking(sig_fds[1], False)
            signal.set_wakeup_fd(sig_fds[1], warn_on_full_buffer=False)
            watchdog = CollectiveWatchdog(
                self.group, self.abort_grace_s, os._exit, signal_fd=sig_fds[0],
                on_signal=lambda data: self.stop.set(), parent_pid=self.head_pid,
                parent_gone_code=EXIT_PARENT_GONE,
            )
        code = 0
        try:
            self.group.join()
            if self.rank == 0:
                report_phase("ready")
            step = 0
            while not self.stop.is_set():
                step += 1
                self._step(step)
                if step == 1 and self.rank == 0 and self.phase == "busy":
                    report_phase("busy")
                if os.getppid() != self.head_pid:
                    return EXIT_PARENT_GONE
                self.stop.wait(STEP_PAUSE_S)
        except Exception:  # noqa: BLE001 - a wait or a collective failed: a peer is gone
            self.peer_gone = True
            code = EXIT_PEER_GONE
        finally:
            self._teardown()
            if watchdog is not None:
                watchdog.close()
        return code

    def _step(self, step: int) -> None:
        store = self.group.store
        last = self.rank == self.world_size - 1
        if last and self.phase == "in_collective" and self.stop.wait(STRAGGLE_S):
            return
        store.set(f"step/{step}/{self.rank}", "1")
        peers = [f"step/{step}/{p}" for p in range(self.world_size) if p != self.rank]
        if self.rank == 0 and step == 1 and self.phase == "in_collective":
            report_phase("in_collective")
        self.group.in_collective.set()
        try:
            self._wait_for_peers(store, peers)
        finally:
            self.group.in_collective.clear()
        self.group.step()

    def _wait_for_peers(self, store: Any, keys: list[str]) -> None:
        """Its own frame: the collective-hang finding names it (docs/distributed.md)."""
        store.wait(keys, self.wait_timeout)

    def _teardown(self) -> None:
        if not self.group.joined:
            return
        if self.faults.destroy_without_abort:
            self._synchronise_then_destroy()
        else:
            self.group.shutdown(peer_gone=self.peer_gone)

    def _synchronise_then_destroy(self) -> None:
        """The bug: every rank must reach the teardown, however long it takes, dead or not."""
        store = self.group.store
        store.set(f"teardown/{self.rank}", "1")
        store.wait([f"teardown/{p}" for p in range(self.world_size)], UNTIMED)
        dist.destroy_process_group()
