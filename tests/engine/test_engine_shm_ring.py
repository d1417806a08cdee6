"""The EngineCore → frontend output ring: outputs arrive through it, and no segment outlives
the engine however its process ends (clean stop, SIGKILL); the #51579 fault leaves one."""

from __future__ import annotations

import os
import signal

from engine_proc_testing import fast_config, wait_for

from pytest_shutdown.engine.core_proc import ChildFaults
from pytest_shutdown.engine.processes import EngineProcManager
from pytest_shutdown.engine.shm_ring import unlink_segment


def _exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def _finish(manager: EngineProcManager, count: int) -> list[str]:
    for i in range(count):
        manager.add_request(f"r{i}", [1, 2, 3], 4)
    finished: list[str] = []
    while len(finished) < count:
        output = manager.outputs.get(timeout=30)
        if output.finished:
            finished.append(output.request_id)
    return finished


def test_outputs_come_through_the_ring_and_a_clean_stop_unlinks_it() -> None:
    manager = EngineProcManager(fast_config(data_parallel_size=2))
    names = list(manager._shared.ring_names)
    try:
        assert set(manager._shared.rings) == {0, 1}  # both readers attached at ready
        assert all(_exists(n) for n in names)
        assert sorted(_finish(manager, 6)) == [f"r{i}" for i in range(6)]
    finally:
        manager.shutdown()
    assert not any(_exists(n) for n in names)


def test_the_parent_unlinks_a_sigkilled_engines_segment() -> None:
    manager = EngineProcManager(fast_config())
    (name,) = manager._shared.ring_names
    try:
        _finish(manager, 1)
        pid = manager.processes[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: manager.is_shut_down, 30, "the manager noticing the death")
        assert not _exists(name)
    finally:
        manager.shutdown()
        unlink_segment(name)


def test_without_the_parents_unlink_a_sigkilled_engine_leaves_its_segment() -> None:
    manager = EngineProcManager(fast_config(), faults=ChildFaults(parent_unlinks_ring=False))
    (name,) = manager._shared.ring_names
    try:
        pid = manager.processes[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: manager.is_shut_down, 30, "the manager noticing the death")
        assert _exists(name)  # vLLM #51579: nobody unlinks what the dead child created
    finally:
        manager.shutdown()
        unlink_segment(name)
