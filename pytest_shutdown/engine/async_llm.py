"""AsyncLLM: the asyncio front end of the reference engine, modelled on vLLM's ``AsyncLLM``.

An asyncio client with an output-handler task, talking to its EngineCore processes over ZMQ
(``zmq.asyncio`` sockets here, plain ones in the processes: ``engine/zmq_core.py``). Use::

    async with AsyncLLM.from_config(config) as engine:
        async for out in engine.generate("hello", max_tokens=8):
            ...

``from_config`` opens the context and the sockets and starts the processes (it does not wait);
``start()`` (``async with`` does it) waits for every ``ready`` and starts the output handler and
the monitor thread. ``aclose()`` is idempotent and, in this order: marks the engine closing,
cancels and awaits the output handler, stops the monitor, tells the EngineCores to stop and
stops them (SIGTERM, one deadline, the survivors' trees killed through the one tree killer;
waited for in a thread, the loop keeps running), closes every socket with linger 0 on its own
loop, and terminates the context (a bounded probe: ``term_within``). ``shutdown()`` is the
same, synchronous, from any thread: with the sockets' loop running in another thread it closes
them *on that loop* (``call_soon_threadsafe``); once that loop is closed it closes them
directly (nothing left to run on it). A call from a loop that is closing (``asyncio.run``'s
teardown) works, and so does one after the loop is closed (``shutdown()``, or ``aclose()`` on
another loop): every wait is bounded.

``AsyncFaults`` puts back, one toggle each, the regressions real engines filed (see
docs/engine.md): all default to the correct behaviour.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import zmq

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.renderer import ByteTokenizer
from pytest_shutdown.engine.stopping import validate_timeout
from pytest_shutdown.engine.zmq_client import (
    TERM_TIMEOUT_S,
    ClientResources,
    close_sockets,
    open_resources,
    reap_on_gc,
    remove_ipc_dir,
    start_monitor,
    start_processes,
    stop_monitor,
    stop_processes,
    term_within,
)

logger = logging.getLogger("pytest_shutdown.engine")

# The messages (kept equal to engine/zmq_core.py's, which imports torch).
_ADD, _ABORT, _SHUTDOWN = "add", "abort", "shutdown"
_READY, _OUTPUTS, _EXITING = "ready", "outputs", "exiting"

#: How long ``aclose`` waits for the cancelled output handler.
HANDLER_CANCEL_S = 2.0
#: How long ``shutdown()`` from another thread waits for the loop to run the close.
ON_LOOP_CLOSE_S = 2.0
#: How often a wait on a thread looks at it.
_THREAD_POLL_S = 0.01


class EngineDeadError(RuntimeError):
    """An EngineCore process died (or left) while the engine was running."""


@dataclass(frozen=True)
class AsyncFaults:
    """The async front end's bug toggles, one per regression; the defaults are correct."""

    #: False: ``aclose`` stops the EngineCores before the output handler and leaves the handler
    #: pending; the handler sees the EngineCores leave and logs an ``EngineDeadError``
    #: traceback during a graceful shutdown (vLLM #48745).
    cancel_output_handler: bool = True
    #: False: sockets are closed with their default linger (forever): ``Context.term()`` hangs
    #: on a message queued for an EngineCore that is gone (vLLM PR #13298).
    socket_linger_zero: bool = True
    #: False: ``shutdown()`` from another thread closes the async sockets there, not on their
    #: loop: the task awaiting a socket is not woken (vLLM PR #22877).
    close_on_own_loop: bool = True
    #: False: once the sockets' loop is closed, socket and context cleanup is skipped
    #: (vLLM PR #57757).
    cleanup_after_loop_closed: bool = True
    #: False: a second ``aclose()`` runs the shutdown again (and raises on the closed sockets).
    idempotent_aclose: bool = True


@dataclass(frozen=True)
class AsyncRequestOutput:
    """One output of ``generate``: the tokens so far, their text, and whether it finished."""

    request_id: str
    prompt: str
    new_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class AsyncLLM:
    """The reference engine's asyncio front end; ``async with`` or ``await aclose()``."""

    def __init__(self, config: EngineConfig | None = None, *, faults: AsyncFaults | None = None):
        self.config = config if config is not None else EngineConfig()
        self.faults = faults if faults is not None else AsyncFaults()
        self._res: ClientResources = open_resources(self.config)
        self._finalizer = weakref.finalize(self, reap_on_gc, self._res)
        self._tokenizer = ByteTokenizer()
        self._ids = itertools.count()
        self._next_rank = itertools.cycle(range(self.config.data_parallel_size))
        self._requests: dict[str, asyncio.Queue[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.output_handler: asyncio.Task[None] | None = None
        self.engine_pids: dict[int, int] = {}
        self.engine_dead = False
        self._started = False
        self._closed = False
        try:
            start_processes(self._res)
        except BaseException:
            self._finalizer()
            raise

    @classmethod
    def from_config(
        cls, config: EngineConfig | None = None, *, faults: AsyncFaults | None = None
    ) -> AsyncLLM:
        return cls(config, faults=faults)

    # -- what tests read -------------------------------------------------------------------
    @property
    def context(self) -> zmq.Context[Any]:
        return self._res.context

    @property
    def sockets(self) -> list[zmq.Socket[Any]]:
        return list(self._res.sockets)

    @property
    def processes(self) -> list[Any]:
        return list(self._res.processes)

    @property
    def input_addrs(self) -> list[str]:
        return list(self._res.input_addrs)

    @property
    def context_terminated(self) -> bool:
        return self._res.context_terminated

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- start-up --------------------------------------------------------------------------
    async def start(self) -> None:
        """Wait for every EngineCore's ready (``startup_timeout_s``); start handler and monitor."""
        if self._started:
            return
        if self._closed:
            raise RuntimeError("AsyncLLM is closed")
        self._started = True
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.config.startup_timeout_s
        sock = self._res.output_socket
        while len(self.engine_pids) < len(self._res.processes):
            dead = [p for p in self._res.processes if p.exitcode is not None]
            if dead:
                raise EngineDeadError(
                    f"{dead[0].name} exited during start-up (exit code {dead[0].exitcode})"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"AsyncLLM: the EngineCores were not ready within "
                    f"EngineConfig.startup_timeout_s={self.config.startup_timeout_s} s"
                )
            if await sock.poll(50):
                msg = pickle.loads(await sock.recv())
                if msg[0] == _READY:
                    self.engine_pids[msg[1]] = msg[2]
        loop = self._loop
        start_monitor(self._res, _on_death_of(weakref.ref(self), loop))
        self.output_handler = loop.create_task(self._handle_outputs(), name="output_handler")

    async def __aenter__(self) -> AsyncLLM:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- requests --------------------------------------------------------------------------
    async def generate(
        self, prompt: str, max_tokens: int = 16, *, request_id: str | None = None
    ) -> AsyncIterator[AsyncRequestOutput]:
        """Outputs of one request as they come; the last one has a ``finish_reason``."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: expected a positive integer, got {max_tokens!r}")
        tokens = self._tokenizer.encode(prompt)
        if not tokens:
            raise ValueError(f"prompt: cannot generate from an empty prompt {prompt!r}")
        await self.start()
        if self._closed or self._res.closing.is_set():
            raise RuntimeError("AsyncLLM is closed")
        if self.engine_dead:
            raise EngineDeadError("an EngineCore process is dead")
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._requests[rid] = queue
        rank = next(self._next_rank)
        finished = False
        try:
            await self._res.input_sockets[rank].send_pyobj((_ADD, rid, tokens, max_tokens))
            so_far: list[int] = []
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                new, reason = item
                so_far.extend(new)
                finished = reason is not None
                yield AsyncRequestOutput(
                    rid, prompt, list(new), list(so_far), self._tokenizer.decode(so_far), reason
                )
        finally:
            self._requests.pop(rid, None)
            if not finished and not self._res.closing.is_set():
                _send_nowait(self._res.input_sockets[rank], (_ABORT, [rid]))

    # -- output handler and monitor ---------------------------------------------------------
    async def _handle_outputs(self) -> None:
        """Dispatch every output until cancelled; an EngineCore that leaves while the engine
        is not closing is an engine death (logged with its traceback, requests failed)."""
        sock = self._res.output_socket
        while True:
            msg = pickle.loads(await sock.recv())  # recv_pyobj's chained future logs at close
            try:
                self._dispatch(msg)
            except EngineDeadError as exc:
                logger.exception("AsyncLLM output_handler failed")
                self._fail_requests(exc)

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == _OUTPUTS:
            for rid, new, reason in msg[2]:
                queue = self._requests.get(rid)
                if queue is not None:
                    queue.put_nowait((new, reason))
        elif msg[0] == _EXITING and not self._res.closing.is_set():
            self.engine_dead = True
            raise EngineDeadError(f"EngineCore_DP{msg[1]} left while the engine was running")

    def _engine_died(self, name: str, exitcode: int | None) -> None:
        if self._res.closing.is_set():
            return
        self.engine_dead = True
        logger.error("[shutdown] %s died (exit code %s); failing its requests", name, exitcode)
        self._fail_requests(EngineDeadError(f"{name} died with exit code {exitcode}"))

    def _fail_requests(self, exc: BaseException) -> None:
        for queue in list(self._requests.values()):
            try:
                queue.put_nowait(exc)
            except RuntimeError:  # its loop is closed: nobody awaits it any more
                pass

    # -- shutdown --------------------------------------------------------------------------
    async def aclose(self, timeout: float | None = None) -> None:
        """Shut the engine down (process timeout ``timeout``); later calls do nothing."""
        timeout = validate_timeout(timeout)
        if self._closed and self.faults.idempotent_aclose:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop:
            # Another loop: the sockets' own loop is closed or runs elsewhere (shutdown() knows).
            await _in_thread(lambda: self._shutdown(timeout))
            return
        if self.faults.cancel_output_handler:
            self._res.closing.set()
            await self._cancel_output_handler()
        stop_monitor(self._res)
        self._tell_engines_to_stop()
        await _in_thread(lambda: stop_processes(self._res, timeout))
        self._res.closing.set()
        self._release_sockets()

    async def _cancel_output_handler(self) -> None:
        task = self.output_handler
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=HANDLER_CANCEL_S)

    def _tell_engines_to_stop(self) -> None:
        for sock in self._res.input_sockets:
            _send_nowait(sock, (_SHUTDOWN,))

    def _release_sockets(self) -> None:
        """Close the sockets (here: the caller is on their loop, or it is closed) and
        terminate the context, bounded; no await, so nothing else runs meanwhile."""
        self._fail_requests(RuntimeError("AsyncLLM was closed with the request in flight"))
        linger = 0 if self.faults.socket_linger_zero else None
        for exc in close_sockets(self._res, linger):
            logger.debug("closing a ZMQ socket: %r", exc)
        if not term_within(self._res, TERM_TIMEOUT_S):
            logger.warning(
                "[shutdown] AsyncLLM: zmq Context.term() did not return within %s s "
                "(a socket still open, or lingering on unsent messages)",
                TERM_TIMEOUT_S,
            )
        remove_ipc_dir(self._res)
        self._finalizer.detach()

    def shutdown(self, timeout: float | None = None) -> None:
        """``aclose()`` for synchronous callers, from any thread, on a live or closed loop (on
        the loop's own thread it blocks the loop while the processes stop: prefer ``aclose``)."""
        timeout = validate_timeout(timeout)
        if self._closed and self.faults.idempotent_aclose:
            return
        self._closed = True
        self._shutdown(timeout)

    def _shutdown(self, timeout: float | None) -> None:
        loop = self._loop
        on_loop = loop is not None and _running_loop() is loop
        live_elsewhere = (
            loop is not None and not on_loop and loop.is_running() and not loop.is_closed()
        )
        self._res.closing.set()
        if on_loop and self.output_handler is not None:
            self.output_handler.cancel()
        elif live_elsewhere and self.faults.close_on_own_loop:
            assert loop is not None
            _run_on_loop(loop, self._cancel_handler_now)
        stop_monitor(self._res)
        self._tell_engines_to_stop()
        stop_processes(self._res, timeout)
        if loop is not None and loop.is_closed() and not self.faults.cleanup_after_loop_closed:
            return  # the bug: nothing is left to run the async cleanup on, so it is skipped
        if live_elsewhere and self.faults.close_on_own_loop:
            assert loop is not None
            if _run_on_loop(loop, self._release_sockets):
                return
            logger.warning("[shutdown] AsyncLLM: the loop did not run the close; closing here")
        self._release_sockets()

    def _cancel_handler_now(self) -> None:
        if self.output_handler is not None:
            self.output_handler.cancel()


def _on_death_of(
    engine_ref: weakref.ReferenceType[AsyncLLM], loop: asyncio.AbstractEventLoop
) -> Callable[[str, int | None], None]:
    """The monitor's callback: it holds the engine weakly (the engine can still be collected)."""

    def on_death(name: str, exitcode: int | None) -> None:
        engine = engine_ref()
        if engine is not None:
            _call_soon(loop, engine._engine_died, name, exitcode)

    return on_death


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed
        pass


def _run_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> bool:
    """Run ``fn`` on ``loop`` (running in another thread) and wait for it, bounded."""
    done = threading.Event()

    def call() -> None:
        try:
            fn()
        finally:
            done.set()

    try:
        loop.call_soon_threadsafe(call)
    except RuntimeError:
        return False
    return done.wait(ON_LOOP_CLOSE_S)


def _send_nowait(sock: zmq.Socket[Any], msg: tuple[Any, ...]) -> None:
    """Queue ``msg`` without waiting (the plain socket's send, not the loop's); a full queue
    drops it. Raises on a closed socket."""
    try:
        zmq.Socket.send(sock, pickle.dumps(msg), zmq.NOBLOCK)
    except zmq.Again:
        pass


async def _in_thread(fn: Callable[[], Any]) -> None:
    """Run blocking ``fn`` in a thread of its own and wait for it without blocking the loop
    (not the default executor: it is gone in a loop that is closing)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    thread = threading.Thread(target=run, name="async-llm-shutdown", daemon=True)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(_THREAD_POLL_S)
    if errors:
        raise errors[0]
