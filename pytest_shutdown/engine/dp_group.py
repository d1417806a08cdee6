"""The data-parallel group: the EngineCores ``EngineCore_DP{i}`` of one engine, in lockstep.

Modelled on vLLM's ``DPEngineCoreProc``: with ``data_parallel_size`` > 1 (and
``EngineConfig.dp_process_group`` on) the EngineCores join one ``torch.distributed`` group and,
every busy-loop iteration, all-reduce their state (vLLM's ``_has_global_unfinished_reqs``):
whether a rank has unfinished requests, whether it was told to stop, and whether it is done
(stopped with no work left). A stop told to one rank reaches every rank through that
all-reduce, and the ranks leave the loop at the same iteration, so the teardown barrier meets
every peer and the group is destroyed; a rank that leaves any other way (an error, a peer gone)
aborts it instead.

The group is the EngineCore's *default* group: an EngineCore process is never a TP rank (its
TP workers are processes of their own, each with its own default group), so nothing else in it
holds one, and ``RankGroup`` serves as it is. Rank 0 hosts the group's ``TCPStore`` on the port
the manager picked (vLLM's DP rank 0 does the same): the manager runs in the user's process
(a test's), which then never loads ``torch.distributed`` nor keeps the pipe pair its first
store leaves for the process's lifetime; a peer of a rank 0 that dies while they join fails at
once instead of waiting out the store deadline.

Every wait has a deadline: the store connect and ``init_process_group`` (``store_timeout_s``,
``collective_timeout_s``), each all-reduce (``collective_timeout_s``), the teardown barrier
(``barrier_timeout_s``). A rank blocked in one of them that is told to stop (a signal, its
parent gone) is ended by its ``CollectiveWatchdog`` after ``collective_abort_grace_s``; a rank
whose peer died gets an error from gloo at once (the peer's sockets close).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.distributed import (
    CollectiveWatchdog,
    RankGroup,
    free_port,
    group_deadlines,
    select_backend,
)

#: How long an idle DP rank waits for input before it takes part in the next all-reduce: its
#: peers wait for it there, so this bounds the latency of a request that wakes an idle group.
DP_IDLE_WAKE_S = 0.05


@dataclass(frozen=True)
class DPGroupSpec:
    """What every rank needs to join: the backend and the store's port on 127.0.0.1."""

    backend: str
    port: int


@dataclass(frozen=True)
class DPStepState:
    """The group's state after one all-reduce."""

    #: Some rank has unfinished work: every rank steps again without waiting for input.
    unfinished: bool
    #: Some rank was told to stop: every rank stops (drains or aborts as configured).
    stop_requested: bool
    #: Every rank stopped with no work left: all leave the busy loop now, together.
    all_done: bool


def dp_group_spec(
    config: EngineConfig, *, nccl_available: Callable[[], bool] | None = None
) -> DPGroupSpec | None:
    """The DP group the engine's ranks form, or None (``dp_process_group`` off, or dp == 1).

    The backend is chosen as for the TP group (``select_backend``: gloo on the CPU, nccl on a
    CUDA device where torch has it); the port is free on 127.0.0.1 now.
    """
    if config.dp_process_group == "off" or config.data_parallel_size < 2:
        return None
    device_type = config.device.split(":")[0]
    backend = select_backend(config.dp_process_group, device_type, nccl_available=nccl_available)
    return DPGroupSpec(backend, free_port())


class DataParallelGroup:
    """One EngineCore's membership in the DP group: join, one all-reduce per step, leave."""

    def __init__(
        self,
        dp_rank: int,
        spec: DPGroupSpec,
        config: EngineConfig,
        exit_process: Callable[[int], None],
    ) -> None:
        self.dp_rank = dp_rank
        self.world_size = config.data_parallel_size
        self.group = RankGroup(
            dp_rank, self.world_size, spec.port, backend=spec.backend, device=config.device,
            deadlines=group_deadlines(config), hosts_store=dp_rank == 0,
        )
        self._grace_s = config.collective_abort_grace_s
        self._exit_process = exit_process
        self.watchdog: CollectiveWatchdog | None = None
        #: A collective failed: a peer is gone (leave by aborting).
        self.peer_gone = False
        #: The busy loop ended at the iteration every rank ended it (leave through the barrier).
        self.left_together = False

    def join(self) -> None:
        """Start the watchdog, then connect to the store and init the group (both deadlined)."""
        self.watchdog = CollectiveWatchdog(self.group, self._grace_s, self._exit_process)
        try:
            self.group.join()
        except RuntimeError:
            self.peer_gone = True
            raise

    def stop(self, code: int) -> None:
        """This rank was told to stop: a collective it is stuck in gets the grace, then exit."""
        if self.watchdog is not None:
            self.watchdog.stop(code)

    def sync(self, *, unfinished: bool, stop_requested: bool, done: bool) -> DPStepState:
        """This iteration's all-reduce; raises ``RuntimeError`` when a peer is gone."""
        try:
            counts = self.group.sum_over_ranks([int(unfinished), int(stop_requested), int(done)])
        except RuntimeError:
            self.peer_gone = True
            raise
        return DPStepState(
            unfinished=counts[0] > 0,
            stop_requested=counts[1] > 0,
            all_done=counts[2] == self.world_size,
        )

    def leave(self) -> str:
        """vLLM's order: barrier with a deadline, then destroy, when the ranks left together;
        abort otherwise. Returns how the group ended (``RankGroup.shutdown``)."""
        try:
            return self.group.shutdown(peer_gone=self.peer_gone or not self.left_together)
        finally:
            if self.watchdog is not None:
                self.watchdog.close()
