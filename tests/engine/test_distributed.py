"""The reference engine's process group: backend choice, deadlines, teardown order, abort.

Real gloo groups of forked ranks over a TCPStore on 127.0.0.1; nccl where a CUDA GPU exists.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
import torch

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.distributed import (
    STORE_HOST,
    CollectiveWatchdog,
    GroupDeadlines,
    RankGroup,
    free_port,
    host_store,
    select_backend,
)
from pytest_shutdown.engine.distributed_tree import distributed_matrix_config
from pytest_shutdown.engine.lifecycle import LifecycleLog
from pytest_shutdown.engine.processes import EngineProcManager, kill_process_tree

FAST = GroupDeadlines(store_timeout_s=10.0, collective_timeout_s=10.0, barrier_timeout_s=2.0)


# -- backend choice (fakes for nccl) ----------------------------------------------------------
@pytest.mark.parametrize(
    ("choice", "device", "nccl", "expected"),
    [
        ("auto", "cpu", True, "gloo"),
        ("auto", "cuda", True, "nccl"),
        ("auto", "cuda", False, "gloo"),
        ("gloo", "cuda", True, "gloo"),
        ("nccl", "cuda", True, "nccl"),
        # not a backend: the error it raises
        ("nccl", "cpu", True, "needs a CUDA device"),
        ("nccl", "cuda", False, "has no nccl"),
        ("mpi", "cpu", True, "process_group: expected one of auto, gloo, nccl, got 'mpi'"),
        ("off", "cpu", True, "process_group: expected one of"),
    ],
)
def test_the_backend_is_nccl_on_a_cuda_device_with_nccl_else_gloo_else_an_error(
    choice: str, device: str, nccl: bool, expected: str
) -> None:
    if expected in ("gloo", "nccl"):
        assert select_backend(choice, device, nccl_available=lambda: nccl) == expected
    else:  # an impossible backend is an error naming the option
        with pytest.raises(ValueError, match=expected):
            select_backend(choice, device, nccl_available=lambda: nccl)


def test_the_engine_config_validates_the_group_and_its_deadlines() -> None:
    with pytest.raises(ValueError, match=r"EngineConfig.process_group: unknown value 'mpi'"):
        EngineConfig(process_group="mpi")
    with pytest.raises(ValueError, match=r"EngineConfig.barrier_timeout_s: expected seconds > 0"):
        EngineConfig(barrier_timeout_s=0)
    with pytest.raises(ValueError, match=r"EngineConfig.store_timeout_s"):
        EngineConfig(store_timeout_s=float("nan"))
    with pytest.raises(ValueError, match=r"GroupDeadlines.collective_timeout_s"):
        GroupDeadlines(collective_timeout_s=-1)


def test_a_free_port_is_on_the_loopback_and_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind((STORE_HOST, port))


# -- real gloo ranks ---------------------------------------------------------------------------
def _rank_main(
    rank: int,
    port: int,
    die_after_step: bool,
    out: Connection,
    rank1_alive: Connection,
    not_mine: Connection | None,
) -> None:
    """``rank1_alive``: the read end of a pipe whose only write end left open is rank 1's (the
    others close theirs: ``not_mine``), so that it reads EOF once rank 1 has exited."""
    import torch.distributed as dist

    if not_mine is not None:
        not_mine.close()
    group = RankGroup(rank, 2, port, deadlines=FAST)
    group.join()
    result: dict[str, Any] = {"step": group.step()}
    if die_after_step and rank == 1:
        os._exit(9)
    if die_after_step:
        # Rank 1 is gone (its end of the pipe closed) before this rank enters the next step.
        if rank1_alive.poll(60):
            with contextlib.suppress(EOFError):
                rank1_alive.recv_bytes()
        try:
            group.step()
            result["second_step"] = "ok"
        except RuntimeError:
            result["second_step"] = "failed"
    started = time.monotonic()
    result["ending"] = group.shutdown()
    result["shutdown_s"] = time.monotonic() - started
    result["initialized_after"] = dist.is_initialized()
    result["again"] = group.shutdown()
    out.send(result)


@pytest.fixture
def two_ranks() -> Iterator[Any]:
    procs: list[Any] = []

    def start(die_after_step: bool) -> list[dict[str, Any]]:
        port = free_port()
        store = host_store(port, 2, FAST)
        ctx = multiprocessing.get_context("fork")
        pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
        alive_r, alive_w = ctx.Pipe(duplex=False)
        for rank in range(2):
            # Rank 0, forked with a copy of the write end, closes it first thing.
            not_mine = alive_w if rank == 0 else None
            args = (rank, port, die_after_step, pipes[rank][1], alive_r, not_mine)
            proc = ctx.Process(target=_rank_main, args=args)
            proc.start()
            procs.append(proc)
        alive_w.close()  # rank 1 keeps the last copy
        alive_r.close()
        results = []
        for rank, (reader, _) in enumerate(pipes):
            if die_after_step and rank == 1:
                continue
            assert reader.poll(60), f"rank {rank} sent nothing within 60 s"
            results.append(reader.recv())
        for proc in procs:
            proc.join(30)
        del store
        return results

    yield start
    for proc in procs:
        if proc.is_alive():
            kill_process_tree(proc.pid)


def test_ranks_run_a_collective_and_tear_down_in_order(two_ranks: Any) -> None:
    results = two_ranks(False)
    for result in results:
        assert result["step"] == 2  # both ranks took part
        assert result["ending"] == "destroyed"  # barrier, then destroy
        assert result["initialized_after"] is False
        assert result["again"] == "destroyed"  # idempotent


def test_a_rank_whose_peer_died_aborts_instead_of_destroying(two_ranks: Any) -> None:
    (survivor,) = two_ranks(True)
    assert survivor["step"] == 2
    assert survivor["second_step"] == "failed"  # gloo saw the peer's connection close
    assert survivor["ending"] == "aborted"  # the barrier failed: abort, no destroy
    assert survivor["initialized_after"] is False
    assert survivor["shutdown_s"] < FAST.barrier_timeout_s + 5  # bounded, not a hang


# -- the watchdog (no torch needed) ----------------------------------------------------------
class _FakeGroup:
    def __init__(self) -> None:
        self.in_collective = threading.Event()


def test_the_watchdog_ends_a_rank_stuck_in_a_collective_after_a_stop() -> None:
    group = _FakeGroup()
    exits: list[int] = []
    stuck: list[bool] = []
    dog = CollectiveWatchdog(
        group, 0.2, exits.append, on_stuck=lambda: stuck.append(True)  # type: ignore[arg-type]
    )
    try:
        group.in_collective.set()
        time.sleep(0.4)
        assert exits == []  # inside a collective, but nobody asked it to stop
        dog.stop(7)
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exits == [7]
        assert stuck == [True]
    finally:
        dog.close()


def test_the_watchdog_leaves_a_stopping_rank_alone_outside_a_collective() -> None:
    group = _FakeGroup()
    exits: list[int] = []
    dog = CollectiveWatchdog(group, 0.1, exits.append)  # type: ignore[arg-type]
    try:
        dog.stop(0)
        time.sleep(0.5)
        assert exits == []
    finally:
        dog.close()


def test_the_watchdog_reads_signals_and_forwards_them() -> None:
    group = _FakeGroup()
    exits: list[int] = []
    forwarded: list[bytes] = []
    r, w = os.pipe()
    dog = CollectiveWatchdog(
        group, 0.1, exits.append, signal_fd=r, on_signal=forwarded.append  # type: ignore[arg-type]
    )
    try:
        group.in_collective.set()
        os.write(w, b"\x0f")  # what the C-level handler writes for SIGTERM
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert forwarded == [b"\x0f"]
        assert exits == [0]
    finally:
        dog.close()
        os.close(r)
        os.close(w)


# -- the engine's TP group ---------------------------------------------------------------------
def test_the_tp_workers_of_an_engine_form_a_group_and_destroy_it_on_shutdown(log: str) -> None:
    config = distributed_matrix_config(data_parallel_size=1)
    manager = EngineProcManager(config, lifecycle_log=log)
    try:
        manager.add_request("r", [1, 2, 3], 8)
        finished = False
        deadline = time.monotonic() + 30
        while not finished and time.monotonic() < deadline:
            finished = manager.outputs.get(timeout=30).finished
    finally:
        outcome = manager.shutdown()
    assert outcome is not None and not outcome.any_force_killed
    events = LifecycleLog.read(log)
    joined = sorted(e["tp_rank"] for e in events if e["event"] == "group_joined")
    left = {e["tp_rank"]: e["ending"] for e in events if e["event"] == "group_left"}
    assert joined == [0, 1]
    assert left == {0: "destroyed", 1: "destroyed"}
    assert not [e for e in events if e["event"] in ("collective_failed", "collective_abandoned")]


def test_without_a_group_the_workers_join_none(log: str) -> None:
    manager = EngineProcManager(
        distributed_matrix_config(data_parallel_size=1, process_group="off"), lifecycle_log=log
    )
    manager.shutdown()
    assert not [e for e in LifecycleLog.read(log) if e["event"].startswith("group_")]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the nccl path needs a CUDA GPU; this machine has none"
)
def test_a_single_nccl_rank_destroys_and_aborts() -> None:  # pragma: no cover - GPU only
    port = free_port()
    deadlines = GroupDeadlines(10.0, 10.0, 5.0)
    store = host_store(port, 1, deadlines)
    group = RankGroup(0, 1, port, backend="nccl", device="cuda:0", deadlines=deadlines)
    group.join()
    assert group.step() == 1
    assert group.shutdown(peer_gone=True) == "aborted"
    del store
