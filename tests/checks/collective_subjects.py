"""Trees of gloo ranks for the ``collective-hang`` tests (module-level: the launcher imports them).

The root forks ``world`` ranks (``Rank0``, ``Rank1``, ...: the rank is read from the name), each
dying with the root (``PR_SET_PDEATHSIG``, as launchers set it). They form a gloo group over a
``TCPStore`` hosted by rank 0. Every wait has a deadline (``WAIT_S``): the store, the group (whose
timeout gloo applies to every collective), the sleeps.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from pytest_shutdown.engine.distributed import free_port

#: The deadline of every wait of these trees: far beyond the check's deadline.
WAIT_S = 60.0
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _join_group(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=WAIT_S)
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=WAIT_S)
    )


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _keeper() -> None:
    _prctl(PR_SET_NAME, b"keeper")
    time.sleep(WAIT_S)


def _collective_rank(rank: int, world: int, port: int, operation: str, dead: int) -> None:
    _prctl(PR_SET_NAME, f"Rank{rank}".encode())
    _prctl(PR_SET_PDEATHSIG, 9)
    import torch
    import torch.distributed as dist

    _join_group(rank, world, port)
    if rank == dead:
        # A worker forked after the group was formed (a data-loader's) inherits the rank's gloo
        # connections: once the rank is SIGKILLed they stay open, so its peers are not told it
        # died (gloo would fail their collective at once) and wait in it.
        mp.get_context("fork").Process(target=_keeper, name="keeper", daemon=False).start()
        _say(f"rank {rank} idle")
        time.sleep(WAIT_S)
        return
    tensor = torch.ones(1)
    _say(f"rank {rank} entering {operation}")
    if operation == "all_reduce":
        dist.all_reduce(tensor)
    elif operation == "barrier":
        dist.barrier()
    elif operation == "broadcast":
        dist.broadcast(tensor, src=dead)
    else:
        raise ValueError(operation)


def _sleeper() -> None:
    time.sleep(WAIT_S)


def _exiting_rank(rank: int, world: int, port: int, dead: int) -> None:
    """Joins the group, then (rank 0) returns while a non-daemon thread sleeps: its exit hangs
    in the interpreter's join of that thread, no collective anywhere."""
    _prctl(PR_SET_NAME, f"Rank{rank}".encode())
    _prctl(PR_SET_PDEATHSIG, 9)
    _join_group(rank, world, port)
    if rank == dead:
        _say(f"rank {rank} idle")
        time.sleep(WAIT_S)
        return
    threading.Thread(target=_sleeper, name="lingering", daemon=False).start()
    _say(f"rank {rank} exiting")


def _start_ranks(target: Callable[..., None], world: int, *args: object) -> None:
    port = free_port()
    ctx = mp.get_context("fork")
    ranks = []
    for rank in range(world):
        proc = ctx.Process(target=target, args=(rank, world, port, *args), name=f"Rank{rank}")
        proc.start()
        ranks.append(proc)
    for proc in ranks:
        proc.join(WAIT_S)


def ranks_in_collective(operation: str, world: int = 2, dead: int = 1) -> None:
    """Every rank but ``dead`` enters ``operation``; ``dead`` never does (it is to be killed)."""
    _start_ranks(_collective_rank, world, operation, dead)


def ranks_stuck_exiting(world: int = 2, dead: int = 1) -> None:
    """Every rank but ``dead`` leaves its target with a non-daemon thread sleeping."""
    _start_ranks(_exiting_rank, world, dead)
