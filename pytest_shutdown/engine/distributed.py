"""A real ``torch.distributed`` process group for the reference engine's ranks, with deadlines.

Ranks rendezvous over a ``TCPStore`` on 127.0.0.1. Every wait has a deadline: the store connect,
``init_process_group`` (whose timeout gloo applies to every collective too), and the teardown
barrier. With a peer gone the group is *aborted*, never destroyed: ``destroy_process_group`` is
collective in nccl and hangs on a dead peer (PyTorch #119215, SGLang #39560). No torch import at
module level.
"""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pytest_shutdown.engine.config import PROCESS_GROUP_CHOICES, EngineConfig

logger = logging.getLogger("pytest_shutdown.engine")

#: The only host a store binds or connects to: ranks are simulated on one machine.
STORE_HOST = "127.0.0.1"
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class GroupDeadlines:
    """Every wait of a rank group, in seconds (all > 0): the store (connect, get, wait),
    ``init_process_group`` (gloo applies it to every collective), the teardown barrier."""

    store_timeout_s: float = 30.0
    collective_timeout_s: float = 30.0
    barrier_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("store_timeout_s", "collective_timeout_s", "barrier_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 < value < 1e7)
            ):
                raise ValueError(f"GroupDeadlines.{name}: expected seconds > 0, got {value!r}")


def group_deadlines(config: EngineConfig) -> GroupDeadlines:
    return GroupDeadlines(
        store_timeout_s=config.store_timeout_s,
        collective_timeout_s=config.collective_timeout_s,
        barrier_timeout_s=config.barrier_timeout_s,
    )


def select_backend(
    choice: str, device_type: str, *, nccl_available: Callable[[], bool] | None = None
) -> str:
    """The backend for ``choice`` on ``device_type``: "auto" is nccl on CUDA (when torch has
    nccl), else gloo; an explicit nccl that cannot work is an error."""
    accepted = [c for c in PROCESS_GROUP_CHOICES if c != "off"]
    if choice not in accepted:
        raise ValueError(f"process_group: expected one of {', '.join(accepted)}, got {choice!r}")
    if choice == "gloo":
        return "gloo"
    has_nccl = nccl_available if nccl_available is not None else _nccl_available
    if choice == "nccl":
        if device_type != "cuda":
            raise ValueError(f"process_group='nccl' needs a CUDA device, got {device_type!r}")
        if not has_nccl():
            raise ValueError("process_group='nccl': this torch build has no nccl")
        return "nccl"
    return "nccl" if device_type == "cuda" and has_nccl() else "gloo"


def _nccl_available() -> bool:
    import torch.distributed as dist  # noqa: PLC0415 - torch only when a group is wanted

    return bool(dist.is_available() and dist.is_nccl_available())


def free_port(host: str = STORE_HOST) -> int:
    """A TCP port free on ``host`` now, for a store that a child binds a moment later.

    Taken below the kernel's ephemeral range: a ``bind(0)`` port comes from that range, where a
    parallel test's ``connect`` could take it before the child binds (``EADDRINUSE`` seen in
    ``make test``). Falls back to the OS's pick."""
    low = _ephemeral_low()
    for port in random.sample(range(_FIXED_PORTS_FROM, low), min(32, low - _FIXED_PORTS_FROM)):
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_FIXED_PORTS_FROM = 20000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, _FIXED_PORTS_FROM + 1)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def host_store(port: int, world_size: int, deadlines: GroupDeadlines) -> Any:
    """The group's ``TCPStore`` server, on ``STORE_HOST:port``; it does not wait for clients."""
    return _tcp_store(port, world_size, deadlines, is_master=True)


def _tcp_store(port: int, world_size: int, deadlines: GroupDeadlines, *, is_master: bool) -> Any:
    import torch.distributed as dist  # noqa: PLC0415

    return dist.TCPStore(
        STORE_HOST,
        port,
        world_size + 1,
        is_master=is_master,
        timeout=timedelta(seconds=deadlines.store_timeout_s),
        wait_for_workers=not is_master,  # a client's default: it checks in with the server
    )


class RankGroup:
    """One rank's membership in a process group: join, a collective per step, teardown.

    ``hosts_store``: this rank serves the group's ``TCPStore`` (as vLLM's DP rank 0 does);
    otherwise it connects to one (``host_store``). ``shutdown()`` (idempotent) returns how the
    group ended: ``"destroyed"``, ``"aborted"``, ``"abandoned"`` (no abort for the backend: the
    exit releases it) or ``"not-joined"``.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        port: int,
        *,
        backend: str = "gloo",
        device: str = "cpu",
        deadlines: GroupDeadlines | None = None,
        hosts_store: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: expected 0..{world_size - 1}, got {rank!r}")
        self.rank = rank
        self.world_size = world_size
        self.port = port
        self.backend = backend
        self.device = device
        self.deadlines = deadlines if deadlines is not None else GroupDeadlines()
        self.hosts_store = hosts_store
        self.steps = 0
        self.ending: str | None = None
        #: True while this rank is inside a collective (the watchdog reads it).
        self.in_collective = threading.Event()
        self.store: Any = None
        self._lock = threading.Lock()

    @property
    def joined(self) -> bool:
        return self.store is not None and self.ending is None

    def join(self) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        self.in_collective.set()  # blocked in C++ as in a collective: the watchdog covers it
        try:
            self.store = _tcp_store(
                self.port, self.world_size, self.deadlines, is_master=self.hosts_store
            )
            dist.init_process_group(
                self.backend,
                store=self.store,
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=self.deadlines.collective_timeout_s),
            )
        finally:
            self.in_collective.clear()

    def step(self) -> int:
        """One collective: the sum over the ranks of 1 (== ``world_size`` when all took part)."""
        return self.sum_over_ranks([1])[0]

    def sum_over_ranks(self, values: Sequence[int]) -> list[int]:
        """Each of ``values`` summed over the ranks; ``RuntimeError`` when a peer is gone."""
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        tensor = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        self.in_collective.set()
        try:
            dist.all_reduce(tensor)
        finally:
            self.in_collective.clear()
        self.steps += 1
        return [int(v) for v in tensor.tolist()]

    def shutdown(self, *, peer_gone: bool = False) -> str:
        with self._lock:
            if self.ending is not None:
                return self.ending
            import torch.distributed as dist  # noqa: PLC0415

            if self.store is None or not dist.is_initialized():
                self.ending = "not-joined"
                return self.ending
            if not peer_gone:
                peer_gone = not self._barrier()
            if peer_gone:
                self.ending = abort_default_group(self.backend)
            else:
                dist.destroy_process_group()
                self.ending = "destroyed"
            self.store = None
            return self.ending

    def _barrier(self) -> bool:
        """False when a peer did not come."""
        import torch.distributed as dist  # noqa: PLC0415

        timeout = timedelta(seconds=self.deadlines.barrier_timeout_s)
        self.in_collective.set()
        try:
            if self.backend == "gloo":
                dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)
            else:  # nccl: the group's own timeout bounds it (its watchdog aborts on expiry)
                dist.barrier()
        except RuntimeError:
            return False
        finally:
            self.in_collective.clear()
        return True


def abort_default_group(backend: str) -> str:
    """Abort the default group without the collective destroy (``_abort_process_group``:
    torch >= 2.4 for nccl, 2.13 for gloo). Without one the group is ``"abandoned"`` to the exit:
    destroying would talk to the dead peer."""
    from torch.distributed import distributed_c10d  # noqa: PLC0415

    abort = getattr(distributed_c10d, "_abort_process_group", None)
    if abort is None:
        return "abandoned"
    try:
        abort()
    except (RuntimeError, NotImplementedError, ValueError):
        logger.warning("[shutdown] %s process group: no abort, abandoned to the exit", backend)
        return "abandoned"
    return "aborted"


class CollectiveWatchdog:
    """Ends a rank stuck in a collective once it was told to stop (a signal, its parent gone).

    A main thread blocked in a collective never runs a Python signal handler nor reads its death
    pipe, so this thread reads the signal wake-up fd (``signal_fd``, each byte forwarded to
    ``on_signal``) and watches ``getppid()``. Once stopped, a collective gets ``grace_s`` (again
    after each one that completes); then ``on_stuck`` and ``exit_process(code)``: the main
    thread cannot be unwound from inside the C++ call.
    """

    POLL_S = 0.05

    def __init__(
        self,
        group: RankGroup,
        grace_s: float,
        exit_process: Callable[[int], None],
        *,
        signal_fd: int | None = None,
        on_signal: Callable[[bytes], None] | None = None,
        parent_pid: int | None = None,
        parent_gone_code: int = 1,
        on_stuck: Callable[[], None] | None = None,
    ) -> None:
        self.group = group
        self.grace_s = grace_s
        self._exit = exit_process
        self._signal_fd = signal_fd
        self._on_signal = on_signal
        self._parent_pid = parent_pid
        self._parent_gone_code = parent_gone_code
        self._on_stuck = on_stuck
        self._code: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collective-watchdog", daemon=True)
        self._thread.start()

    def stop(self, code: int) -> None:
        """The first call's ``code`` wins."""
        if self._code is None:
            self._code = code

    def close(self) -> None:
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self) -> None:
        stuck_since: float | None = None
        last_steps = getattr(self.group, "steps", 0)
        while not self._done.is_set():
            self._poll_signals()
            if self._parent_pid is not None and os.getppid() != self._parent_pid:
                self.stop(self._parent_gone_code)
            steps = getattr(self.group, "steps", 0)
            if self._code is None or not self.group.in_collective.is_set() or steps != last_steps:
                stuck_since = None
                last_steps = steps
                continue
            now = time.monotonic()
            if stuck_since is None:
                stuck_since = now
            elif now - stuck_since >= self.grace_s:
                if self._on_stuck is not None:
                    self._on_stuck()
                self._exit(self._code)
                return

    def _poll_signals(self) -> None:
        if self._signal_fd is None:
            self._done.wait(self.POLL_S)
            return
        try:
            ready, _, _ = select.select([self._signal_fd], [], [], self.POLL_S)
            data = os.read(self._signal_fd, 64) if ready else b""
        except OSError:  # closed under us: the rank is finishing
            self._done.wait(self.POLL_S)
            return
        if data:
            self.stop(0)
            if self._on_signal is not None:
                self._on_signal(data)
