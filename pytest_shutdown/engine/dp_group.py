"""The data-parallel group: the EngineCores ``EngineCore_DP{i}`` of one engine, in lockstep.

Modelled on vLLM's ``DPEngineCoreProc``: with dp > 1 (and ``dp_process_group`` on) the
EngineCores join one group and all-reduce their state every busy-loop iteration (vLLM's
``_has_global_unfinished_reqs``), so a stop told to one rank reaches all and they leave the loop
at the same iteration: the teardown barrier meets every peer. A rank that leaves any other way
aborts the group. It is the EngineCore's default group (its TP workers are processes of their
own). Rank 0 hosts the store, as vLLM's does: the manager runs in the test's process, which then
never loads ``torch.distributed``, and a peer of a rank 0 that dies while joining fails at once.
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
    backend: str
    port: int


@dataclass(frozen=True)
class DPStepState:
    """The group's state after one all-reduce: some rank has unfinished work, some rank was told
    to stop, every rank stopped with no work left."""

    unfinished: bool
    stop_requested: bool
    all_done: bool


def dp_group_spec(
    config: EngineConfig, *, nccl_available: Callable[[], bool] | None = None
) -> DPGroupSpec | None:
    """The DP group the engine's ranks form, or None (``dp_process_group`` off, or dp == 1)."""
    if config.dp_process_group == "off" or config.data_parallel_size < 2:
        return None
    device_type = config.device.split(":")[0]
    backend = select_backend(config.dp_process_group, device_type, nccl_available=nccl_available)
    return DPGroupSpec(backend, free_port())


class DataParallelGroup:
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
        self.peer_gone = False
        self.left_together = False

    def join(self) -> None:
        self.watchdog = CollectiveWatchdog(self.group, self._grace_s, self._exit_process)
        try:
            self.group.join()
        except RuntimeError:
            self.peer_gone = True
            raise

    def stop(self, code: int) -> None:
        if self.watchdog is not None:
            self.watchdog.stop(code)

    def sync(self, *, unfinished: bool, stop_requested: bool, done: bool) -> DPStepState:
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
        """Barrier then destroy when the ranks left together, else abort; how it ended."""
        try:
            return self.group.shutdown(peer_gone=self.peer_gone or not self.left_together)
        finally:
            if self.watchdog is not None:
                self.watchdog.close()
