"""``RayEngine``: the reference engine's DP ranks as Ray actors in placement groups.

As vLLM's Ray executor: one placement group per DP rank, an ``EngineCoreActor`` in it running
an in-process ``EngineCore``. ``shutdown()`` (or the finalizer) shuts each engine down, kills the
actor and removes its placement group, all against deadlines. Actors are never detached, so a
dead driver takes them along. Faults put back ``keep_placement_groups`` (ray #64035: the groups
stay and hold their resources) and ``detached`` (ray #31738: detached actors, no finalizer).
Ray is imported when an engine is made.
"""

from __future__ import annotations

import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore

#: Every name this module gives a Ray object starts with it.
NAME_PREFIX = "pytest-shutdown-"


@dataclass(frozen=True)
class RayFaults:
    """The production bugs the regressions put back (each off by default)."""

    keep_placement_groups: bool = False
    detached: bool = False


class EngineCoreActor:
    """The body of one DP rank's actor: an in-process ``EngineCore``."""

    def __init__(self, config: EngineConfig) -> None:
        self.core: Any = EngineCore(config)

    def pid(self) -> int:
        import os  # noqa: PLC0415

        return os.getpid()

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        return list(self.core.generate(prompt, max_tokens))

    def shutdown(self) -> bool:
        self.core.shutdown()
        return bool(self.core.is_shut_down)


class RayEngine:
    """``data_parallel_size`` EngineCore actors, each in a placement group of its own."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        faults: RayFaults | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        import ray  # noqa: PLC0415
        from ray.util.placement_group import placement_group  # noqa: PLC0415
        from ray.util.scheduling_strategies import (  # noqa: PLC0415
            PlacementGroupSchedulingStrategy,
        )

        self.config = config if config is not None else EngineConfig(platform="cpu")
        self.faults = faults if faults is not None else RayFaults()
        self.name = f"{NAME_PREFIX}{uuid.uuid4().hex[:8]}"
        self.actors: list[Any] = []
        self.placement_groups: list[Any] = []
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        if not self.faults.detached:  # before the first actor: nothing is ever unowned
            self._finalizer = weakref.finalize(
                self, _release, self.actors, self.placement_groups, self.faults, timeout_s
            )
        remote = ray.remote(num_cpus=1, max_restarts=0)(EngineCoreActor)
        rank_config = self.config.replace(data_parallel_size=1, tensor_parallel_size=1)
        deadline = time.monotonic() + timeout_s
        for rank in range(self.config.data_parallel_size):
            pg = placement_group(
                [{"CPU": 1}], strategy="STRICT_PACK", name=f"{self.name}-pg-dp{rank}",
                lifetime="detached" if self.faults.detached else None,
            )
            self.placement_groups.append(pg)
            ray.get(pg.ready(), timeout=_left(deadline))
            options: dict[str, Any] = dict(
                name=f"{self.name}-EngineCore_DP{rank}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=0
                ),
            )
            if self.faults.detached:
                options["lifetime"] = "detached"
            self.actors.append(remote.options(**options).remote(rank_config))
        self.pids = ray.get([a.pid.remote() for a in self.actors], timeout=_left(deadline))

    def generate(self, prompt: list[int], max_tokens: int = 4, *, rank: int = 0,
                 timeout_s: float = 60.0) -> list[int]:
        import ray  # noqa: PLC0415

        result: list[int] = ray.get(
            self.actors[rank].generate.remote(prompt, max_tokens), timeout=timeout_s
        )
        return result

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Shut every rank down (deadline), kill the actors, remove the placement groups."""
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        _release(self.actors, self.placement_groups, self.faults, timeout_s)

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _release(actors: list[Any], groups: list[Any], faults: RayFaults, timeout_s: float) -> None:
    import ray  # noqa: PLC0415
    from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

    if not ray.is_initialized():
        return
    deadline = time.monotonic() + timeout_s
    pending = [a.shutdown.remote() for a in actors]
    try:
        ray.wait(pending, num_returns=len(pending), timeout=_left(deadline) / 2)
    except Exception:  # noqa: BLE001 - a dead actor: killing it below is all there is to do
        pass
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
    if not faults.keep_placement_groups:
        for pg in groups:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already removed
                pass
