"""The EngineCore process of the async front end: the reference ``EngineCore`` behind ZMQ.

vLLM's topology: the front end binds one PULL socket for outputs, every EngineCore connects a
PUSH to it; each EngineCore binds a PULL for its inputs and the front end connects a PUSH to it.
Messages are pickled tuples (``send_pyobj``); outputs carry only ids, token ids and the finish
reason's value, so that the front end never imports torch.

The process: its lifelines are armed first (a death pipe from the front end, a parent watch by
pid, ``PR_SET_PDEATHSIG`` where the forking thread is the parent's lifetime), then model loading
(``startup_delay_s``, cut short by a stop or the parent's death), ``ready``, and the busy loop
``poll inputs (≤ POLL_MS); step; send outputs`` until SIGTERM/SIGINT, a ``shutdown`` message or
the front end's death. The handlers only set a flag (the loop polls at least every ``POLL_MS``).
Leaving, it says ``exiting`` to the front end (not after the parent's death), aborts what is left,
shuts the engine down, closes its sockets (the output one lingers at most ``EXIT_LINGER_MS``, the
input one 0) and terminates its context.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

import zmq

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore, EngineCoreOutput, FinishReason, load_model
from pytest_shutdown.engine.lifeline import (
    EXIT_PARENT_GONE,
    ParentWatch,
    on_stop_signals,
    set_parent_death_signal,
    set_process_name,
)
from pytest_shutdown.gpu.forking import reset_after_fork

logger = logging.getLogger("pytest_shutdown.engine")

# Front end -> EngineCore.
MSG_ADD = "add"  # (MSG_ADD, request_id, prompt_token_ids, max_tokens)
MSG_ABORT = "abort"  # (MSG_ABORT, request_ids | None)
MSG_SHUTDOWN = "shutdown"  # (MSG_SHUTDOWN,): a graceful stop, as SIGTERM
# EngineCore -> front end.
MSG_READY = "ready"  # (MSG_READY, rank, pid)
MSG_OUTPUTS = "outputs"  # (MSG_OUTPUTS, rank, [(request_id, new_token_ids, finish_reason)])
MSG_EXITING = "exiting"  # (MSG_EXITING, rank): the busy loop has ended

#: The busy loop's longest wait for input (so a signal's flag is seen this fast).
POLL_MS = 50
#: How long the last messages may take to leave when the process ends.
EXIT_LINGER_MS = 500
#: After its parent dies, a process that has not exited by itself this long after is ended.
PARENT_GONE_EXIT_S = 1.0


class _Stop:
    """What ends the busy loop: a flag set by a signal handler, a message or a lifeline."""

    def __init__(self) -> None:
        self.requested = False
        self.parent_gone = False
        self.event = threading.Event()  # set off the handlers only (model loading waits on it)

    def on_signal(self, signum: int, frame: object) -> None:
        self.requested = True  # only a flag: the busy loop polls it

    def on_parent_gone(self) -> None:
        self.parent_gone = True
        self.requested = True
        self.event.set()


def zmq_engine_main(
    config: EngineConfig,
    rank: int,
    input_addr: str,
    output_addr: str,
    parent_pid: int,
    death_r: Connection,
    pdeathsig: bool,
) -> None:
    """Target of every EngineCore process of ``AsyncLLM``."""
    reset_after_fork(config.start_method)
    set_process_name(f"EngineCore_DP{rank}")
    stop = _Stop()
    on_stop_signals(stop.on_signal)
    if pdeathsig:
        set_parent_death_signal(signal.SIGTERM)
    watch = ParentWatch(parent_pid, stop.on_parent_gone, exit_after_s=PARENT_GONE_EXIT_S).start()
    threading.Thread(
        target=_watch_death_pipe, args=(death_r, stop), name="death-pipe", daemon=True
    ).start()
    ctx = zmq.Context()
    inputs = ctx.socket(zmq.PULL)
    inputs.setsockopt(zmq.LINGER, 0)
    outputs = ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.LINGER, EXIT_LINGER_MS)
    core: EngineCore | None = None
    try:
        inputs.bind(input_addr)
        outputs.connect(output_addr)
        # Given up at once when the front end dies, within POLL_MS of a signal (a flag only).
        load_model(config.startup_delay_s, lambda: stop.requested, stop.event, POLL_MS / 1000)
        if not stop.requested:
            core = EngineCore(config)
            outputs.send_pyobj((MSG_READY, rank, os.getpid()))
            _busy_loop(core, rank, inputs, outputs, stop)
            if not stop.parent_gone:
                outputs.send_pyobj((MSG_EXITING, rank))
    finally:
        on_stop_signals(signal.SIG_IGN)  # a second signal never cuts this short
        if core is not None:
            core.abort_requests(None)
            core.shutdown()
        inputs.close(linger=0)
        outputs.close(linger=0 if stop.parent_gone else EXIT_LINGER_MS)
        ctx.term()
        watch.stop()
    if stop.parent_gone:
        raise SystemExit(EXIT_PARENT_GONE)


def _watch_death_pipe(death_r: Connection, stop: _Stop) -> None:
    """The front end holds the other end: EOF means it is gone (even after a SIGKILL)."""
    try:
        death_r.recv()
    except (EOFError, OSError):
        pass
    stop.on_parent_gone()


def _busy_loop(
    core: EngineCore, rank: int, inputs: zmq.Socket[Any], outputs: zmq.Socket[Any], stop: _Stop
) -> None:
    while not stop.requested:
        timeout = 0 if core.has_work() else POLL_MS
        if inputs.poll(timeout):
            while True:
                try:
                    msg = inputs.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:
                    break
                _handle(core, msg, stop, outputs, rank)
        if core.has_work() and not stop.requested:
            _send_outputs(outputs, rank, core.step())


def _handle(
    core: EngineCore, msg: tuple[Any, ...], stop: _Stop, outputs: zmq.Socket[Any], rank: int
) -> None:
    kind = msg[0]
    if kind == MSG_SHUTDOWN:
        stop.requested = True
    elif kind == MSG_ABORT:
        core.abort_requests(msg[1])
    elif kind == MSG_ADD:
        _, request_id, prompt, max_tokens = msg
        try:
            core.add_request(request_id, prompt, max_tokens)
        except ValueError as exc:
            logger.warning("EngineCore: rejected request %r: %s", request_id, exc)
            _send_outputs(outputs, rank, [EngineCoreOutput(request_id, [], FinishReason.ABORTED)])


def _send_outputs(outputs: zmq.Socket[Any], rank: int, batch: list[EngineCoreOutput]) -> None:
    if batch:
        items = [
            (
                o.request_id,
                list(o.new_token_ids),
                None if o.finish_reason is None else o.finish_reason.value,
            )
            for o in batch
        ]
        outputs.send_pyobj((MSG_OUTPUTS, rank, items))
