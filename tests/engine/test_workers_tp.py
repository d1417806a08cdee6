"""Worker_TP processes: vLLM's topology inside each EngineCore, and the lifelines between levels.

Real processes, real signals: an EngineCore with tensor_parallel_size=2 starts two workers that
hold its device state, waits for them with a deadline, stops them on its own shutdown, dies
(reporting its engine dead) when one of them dies, and abandons a slow model load at once when
it is told to stop. Workers exit when their EngineCore dies, however it died.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from engine_proc_testing import alive, assert_gone, events, fast_config, wait_for

from pytest_shutdown.engine.processes import (
    EngineProcManager,
    EngineStartupError,
    StartupInterrupted,
)


def workers_of(manager: EngineProcManager, rank: int = 0) -> list[psutil.Process]:
    pid = manager.processes[rank].pid
    assert pid is not None
    return sorted(psutil.Process(pid).children(), key=lambda p: p.name())


def test_each_engine_core_starts_its_workers_and_stops_them_with_itself(
    managers: list[EngineProcManager], log: str
) -> None:
    manager = EngineProcManager(
        fast_config(tensor_parallel_size=2, data_parallel_size=2), lifecycle_log=log
    )
    managers.append(manager)
    for rank in range(2):
        core = psutil.Process(manager.processes[rank].pid)
        assert core.name() == f"EngineCore_DP{rank}"
        assert [w.name() for w in workers_of(manager, rank)] == ["Worker_TP0", "Worker_TP1"]
    assert manager.call_utility("ping") == "pong"
    workers = [w.pid for rank in range(2) for w in workers_of(manager, rank)]
    outcome = manager.shutdown()
    assert outcome is not None and not outcome.force_killed
    assert set(outcome.exitcodes.values()) == {0}
    assert_gone(workers, what="workers")
    exits = [e["code"] for e in events(log, "worker_exited")]
    assert exits == [0, 0, 0, 0]  # stopped by their EngineCore, not left to die


def test_a_sigterm_on_top_of_the_stop_never_turns_a_workers_clean_exit_into_death(
    managers: list[EngineProcManager], log: str
) -> None:
    # The EngineCore sends its workers the stop and then SIGTERM; a worker that had put back the
    # default handler before its last line died of that SIGTERM (-15), its exit never logged.
    manager = EngineProcManager(fast_config(tensor_parallel_size=2), lifecycle_log=log)
    managers.append(manager)
    workers = [w.pid for w in workers_of(manager)]
    stop = threading.Event()

    def sigterm_storm() -> None:
        while not stop.is_set():
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            time.sleep(0.0005)

    storm = threading.Thread(target=sigterm_storm)
    storm.start()
    try:
        assert_gone(workers, what="workers")
    finally:
        stop.set()
        storm.join(5.0)
    assert sorted(e["code"] for e in events(log, "worker_exited")) == [0, 0]


def test_a_worker_that_dies_takes_its_engine_core_down(
    managers: list[EngineProcManager],
) -> None:
    manager = EngineProcManager(fast_config(tensor_parallel_size=2))
    managers.append(manager)
    core = manager.processes[0]
    victim, sibling = workers_of(manager)
    victim.kill()
    wait_for(lambda: manager.failures, 10.0, "the manager to see its engine fail")
    assert any("Worker_TP0" in f.detail and "died" in f.detail for f in manager.failures)
    wait_for(lambda: not core.is_alive(), 10.0, "EngineCore_DP0 to exit")
    assert core.exitcode == 1  # it reported its engine dead
    assert_gone([sibling.pid], what="the surviving worker")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_workers_exit_when_their_engine_core_dies(
    managers: list[EngineProcManager], how: str
) -> None:
    manager = EngineProcManager(fast_config(tensor_parallel_size=2))
    managers.append(manager)
    workers = [w.pid for w in workers_of(manager)]
    os.kill(manager.processes[0].pid or 0, getattr(signal, how))
    assert_gone(workers, timeout=5.0, what="workers of the dead EngineCore")


def test_a_slow_model_load_is_abandoned_at_once_on_interrupt(log: str) -> None:
    interrupt = threading.Event()
    config = fast_config(tensor_parallel_size=2, startup_delay_s=60.0)

    def interrupt_once_both_load() -> None:  # not after a fixed time: a busy machine is slow
        try:
            wait_for(lambda: len(events(log, "worker_started")) == 2, 30.0, "two loading workers")
        finally:
            interrupt.set()

    interrupter = threading.Thread(target=interrupt_once_both_load)
    interrupter.start()
    t0 = time.monotonic()
    with pytest.raises(StartupInterrupted, match="start-up interrupted"):
        EngineProcManager(config, lifecycle_log=log, interrupt=interrupt)
    elapsed = time.monotonic() - t0
    interrupter.join(5.0)
    assert elapsed < 45.0, elapsed  # a real hang would take the whole 60 s load
    workers = [e["pid"] for e in events(log, "worker_started")]
    assert len(workers) == 2
    assert_gone(workers, what="loading workers")


def test_a_worker_that_dies_while_loading_fails_the_start(log: str) -> None:
    config = fast_config(tensor_parallel_size=2, startup_delay_s=60.0)
    done: list[BaseException] = []

    def start() -> None:
        try:
            EngineProcManager(config, lifecycle_log=log)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            done.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    worker = wait_for(lambda: events(log, "worker_started"), 30.0, "a loading worker")[0]
    os.kill(worker["pid"], signal.SIGKILL)
    starter.join(30.0)
    assert not starter.is_alive()
    assert isinstance(done[0], EngineStartupError)
    # the worker killed is the first to log its start, not necessarily rank 0
    killed = f"Worker_TP{worker['tp_rank']}"
    assert "EngineCore_DP0" in str(done[0]) and killed in str(done[0])
    assert_gone([e["pid"] for e in events(log, "worker_started")], what="workers")
    assert not alive(worker["pid"])
