"""The front end's side of the ZMQ transport: sockets, context, EngineCore processes, monitor.

``ClientResources`` is what ``AsyncLLM`` owns, kept apart from it so that its GC fallback
(``weakref.finalize``) and its monitor thread never hold the engine: a ``zmq.asyncio`` context,
the output PULL socket it binds, one input PUSH socket per EngineCore (connected to the socket
the EngineCore binds), the EngineCore processes, their death pipes and the directory of the
``ipc://`` endpoints. The processes' target is ``engine/zmq_core.py``'s (it imports torch, as
the sync engine's process manager does).

``term_within`` is the bounded probe of ``Context.term()``: it runs in a daemon thread and the
caller waits at most ``timeout`` seconds (``term()`` blocks for as long as a socket is open, or
a closed one still lingers on unsent messages: vLLM PR #13298).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import zmq
import zmq.asyncio

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.start import engine_context, pdeathsig_safe, serialize_exit_polling
from pytest_shutdown.engine.stopping import ShutdownOutcome, close_quietly, shutdown_processes
from pytest_shutdown.engine.zmq_core import zmq_engine_main

logger = logging.getLogger("pytest_shutdown.engine")

#: Start methods the async front end accepts (its ZMQ context is not fork-safe).
ASYNC_START_METHODS = ("forkserver", "spawn")
#: How long ``term_within`` waits for ``Context.term()`` by default.
TERM_TIMEOUT_S = 2.0
#: How often the monitor wakes without any event.
MONITOR_POLL_S = 1.0


@dataclass
class ClientResources:
    """Everything the front end must release, and who released it."""

    config: EngineConfig
    context: zmq.asyncio.Context
    output_socket: zmq.asyncio.Socket
    input_sockets: list[zmq.asyncio.Socket]
    #: The directory of the endpoints ("" in Linux's abstract namespace).
    ipc_dir: str
    output_addr: str
    input_addrs: list[str]
    processes: list[BaseProcess] = field(default_factory=list)
    death_writers: list[Connection] = field(default_factory=list)
    #: Set once the front end is shutting down: process deaths are no longer failures.
    closing: threading.Event = field(default_factory=threading.Event)
    wake_r: Connection | None = None
    wake_w: Connection | None = None
    #: The thread that ran ``Context.term()`` and whether it returned.
    term_thread: threading.Thread | None = None
    context_terminated: bool = False

    @property
    def sockets(self) -> list[zmq.asyncio.Socket]:
        return [self.output_socket, *self.input_sockets]


def open_resources(config: EngineConfig) -> ClientResources:
    """The context and the sockets (bound/connected), before any process exists."""
    if config.start_method not in ASYNC_START_METHODS:
        raise ValueError(
            f"AsyncLLM: EngineConfig.start_method={config.start_method!r} is not supported (the "
            f"front end holds a ZMQ context, which is not fork-safe); accepted: "
            f"{', '.join(ASYNC_START_METHODS)}"
        )
    ipc_dir, base = _endpoint_base()
    context = zmq.asyncio.Context()
    output_addr = f"{base}/out"
    input_addrs = [f"{base}/in{r}" for r in range(config.data_parallel_size)]
    output_socket = context.socket(zmq.PULL)
    res = ClientResources(config, context, output_socket, [], ipc_dir, output_addr, input_addrs)
    try:
        output_socket.bind(output_addr)
        for addr in input_addrs:
            sock = context.socket(zmq.PUSH)
            res.input_sockets.append(sock)
            sock.connect(addr)
    except BaseException:
        close_sockets(res, linger=0)
        term_within(res, TERM_TIMEOUT_S)
        remove_ipc_dir(res)
        raise
    return res


def _endpoint_base() -> tuple[str, str]:
    """Where the ``ipc://`` endpoints live: Linux's abstract namespace (no file to leave behind
    when a process is SIGKILLed), elsewhere a temporary directory (``ipc_dir``, removed at
    close)."""
    if sys.platform.startswith("linux"):
        return "", f"ipc://@psd-azmq-{os.getpid()}-{secrets.token_hex(6)}"
    ipc_dir = tempfile.mkdtemp(prefix="psd-azmq-")
    return ipc_dir, f"ipc://{ipc_dir}"


def start_processes(res: ClientResources) -> None:
    """Start one EngineCore process per rank (returns at once; ready comes over ZMQ)."""
    ctx = engine_context(res.config)
    pdeathsig = pdeathsig_safe(res.config.start_method)
    for rank, addr in enumerate(res.input_addrs):
        death_r, death_w = ctx.Pipe(duplex=False)
        res.death_writers.append(death_w)
        proc = ctx.Process(  # type: ignore[attr-defined]
            target=zmq_engine_main,
            name=f"EngineCore_DP{rank}",
            args=(res.config, rank, addr, res.output_addr, os.getpid(), death_r, pdeathsig),
            daemon=True,
        )
        res.processes.append(proc)
        try:
            proc.start()
            serialize_exit_polling(proc)
        finally:
            death_r.close()


def start_monitor(res: ClientResources, on_death: Callable[[str, int | None], None]) -> None:
    """A daemon thread that calls ``on_death(name, exitcode)`` for an EngineCore that dies
    while the front end is not closing (vLLM's ``MPClientEngineMonitor``)."""
    res.wake_r, res.wake_w = mp_connection.Pipe(duplex=False)
    threading.Thread(
        target=_monitor,
        args=(res, res.wake_r, on_death),
        name="async-engine-monitor",
        daemon=True,
    ).start()


def _monitor(
    res: ClientResources, wake_r: Connection, on_death: Callable[[str, int | None], None]
) -> None:
    try:
        sentinels = {p.sentinel: p for p in res.processes}
        while sentinels and not res.closing.is_set():
            ready = mp_connection.wait([wake_r, *sentinels], timeout=MONITOR_POLL_S)
            if wake_r in ready or res.closing.is_set():
                return
            dead = [s for s in sentinels if s in ready or sentinels[s].exitcode is not None]
            for sentinel in dead:
                proc = sentinels.pop(sentinel)
                proc.join(1.0)
                if not res.closing.is_set():
                    on_death(proc.name, proc.exitcode)
    except OSError:
        return
    finally:
        close_quietly(wake_r)  # its own end: closed here, never under its wait


def stop_monitor(res: ClientResources) -> None:
    """Wake the monitor (its wake pipe at EOF): it ends and closes its own end."""
    close_quietly(res.wake_w)


def stop_processes(res: ClientResources, timeout: float | None) -> ShutdownOutcome:
    """SIGTERM, one deadline, then the survivors' trees killed (through the one tree killer)."""
    outcome = shutdown_processes(
        res.processes, timeout, default_timeout=res.config.default_process_timeout_s
    )
    for conn in res.death_writers:
        close_quietly(conn)
    return outcome


def close_sockets(res: ClientResources, linger: int | None) -> list[BaseException]:
    """Close every socket (``linger`` None: the socket's own, i.e. wait forever on unsent
    messages); returns what closing raised (a socket whose loop is gone, a wrong thread)."""
    errors: list[BaseException] = []
    for sock in res.sockets:
        try:
            sock.close(linger=linger)
        except Exception as exc:  # noqa: BLE001 - every socket gets its close
            errors.append(exc)
            try:
                zmq.Socket.close(sock, linger=linger)  # the plain socket, without the loop
            except Exception as again:  # noqa: BLE001
                errors.append(again)
    return errors


def term_within(res: ClientResources, timeout: float = TERM_TIMEOUT_S) -> bool:
    """``Context.term()`` in a daemon thread, waited for at most ``timeout`` s: True if it
    returned (a second call only waits for the first one's thread)."""
    thread = res.term_thread
    if thread is None:
        thread = res.term_thread = threading.Thread(
            target=_term, args=(res,), name="zmq-context-term", daemon=True
        )
        thread.start()
    thread.join(timeout)
    return res.context_terminated


def _term(res: ClientResources) -> None:
    try:
        res.context.term()
    except zmq.ZMQError:
        logger.warning("Context.term() failed:\n%s", traceback.format_exc())
    res.context_terminated = True


def wait_until_terminated(res: ClientResources, timeout: float) -> bool:
    """After a ``term_within`` that timed out: whether ``term()`` has returned since."""
    deadline = time.monotonic() + timeout
    while not res.context_terminated and time.monotonic() < deadline:
        time.sleep(0.02)
    return res.context_terminated


def remove_ipc_dir(res: ClientResources) -> None:
    if res.ipc_dir:
        shutil.rmtree(res.ipc_dir, ignore_errors=True)


def reap_on_gc(res: ClientResources) -> None:
    """The GC/atexit fallback: processes, sockets (linger 0, without the loop), context."""
    stop_monitor(res)
    stop_processes(res, None)
    close_sockets(res, linger=0)
    term_within(res, TERM_TIMEOUT_S)
    remove_ipc_dir(res)
