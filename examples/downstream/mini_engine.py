"""A downstream project's own engine: what ``examples/downstream/`` tests with pytest-shutdown.

``MiniEngine`` is shaped like a real inference engine, without torch: a ``Renderer`` (a thread
pool and a prompt cache on one ExitStack, ``weakref.finalize`` as the GC fallback) and one worker
process behind a pipe. Its shutdown follows the contracts the helpers check: idempotent,
non-blocking, the same cleanups on garbage collection, one shared deadline for the worker, and a
process timeout that decouples the request-drain budget from the process-cleanup budget (ROCm
gets a cleanup grace when both are 0).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

#: The ROCm cleanup grace: a process told to abort at once still gets this long to free memory.
ROCM_PROCESS_GRACE_S = 15.0
#: Process timeout when ``shutdown()`` is given none.
DEFAULT_PROCESS_TIMEOUT_S = 5.0
#: How long the worker may take to start and say it is ready.
STARTUP_TIMEOUT_S = 30.0
#: How long a reply from the worker may take.
REPLY_TIMEOUT_S = 10.0
#: After SIGKILL, how long the worker gets to be reaped.
REAP_TIMEOUT_S = 5.0


def process_timeout_for(
    request_timeout: float | None,
    process_timeout: float | None,
    platform: str,
    grace: float = ROCM_PROCESS_GRACE_S,
) -> float | None:
    """The process-cleanup timeout: ``grace`` only for an immediate abort on ROCm."""
    if request_timeout == 0 and process_timeout == 0 and platform == "rocm":
        return grace
    return process_timeout


class PromptCache:
    """A cache with a ``close()`` that must run exactly once."""

    def __init__(self) -> None:
        self.entries: dict[str, list[int]] = {}
        self.close_calls = 0

    def close(self) -> None:
        self.close_calls += 1
        self.entries.clear()


class Renderer:
    """Tokenization on a thread pool; every resource on one ExitStack."""

    def __init__(self, num_workers: int = 2) -> None:
        self._resources = ExitStack()
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="mini-renderer")
        # never enter_context(pool): its __exit__ waits for running work
        self._resources.callback(self._pool.shutdown, wait=False, cancel_futures=True)
        cache = self.cache = PromptCache()
        self._resources.callback(cache.close)  # bound to the object, not to the attribute
        # the GC fallback: the stack's close, never a bound method of self
        self._finalizer = weakref.finalize(self, self._resources.close)

    def encode(self, text: str) -> Future[list[int]]:
        return self._pool.submit(self._encode, text)

    def _encode(self, text: str) -> list[int]:
        return self.cache.entries.setdefault(text, list(text.encode()))

    def shutdown(self) -> None:
        """Idempotent and non-blocking: an ExitStack runs each callback once."""
        self._resources.close()


@dataclass(frozen=True)
class ShutdownOutcome:
    """How the worker ended; ``assert_not_force_killed`` reads exactly these four fields."""

    timeout: float | None
    exitcodes: dict[str, int | None] = field(default_factory=dict)
    force_killed: tuple[str, ...] = ()
    duration_s: float = 0.0


def worker_main(conn: Connection, parent_pid: int, hang_on_stop: bool) -> None:
    """The worker process: answer requests until told to stop, or until the parent is gone."""
    if hang_on_stop:  # a worker stuck in a driver call: ignores both the request and SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send("ready")
    while os.getppid() == parent_pid:
        if not conn.poll(0.1):
            continue
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            if hang_on_stop:
                while os.getppid() == parent_pid:
                    time.sleep(0.1)
            return
        conn.send([token * 2 for token in message])


def _stop_worker(
    renderer: Renderer, proc: BaseProcess, conn: Connection, timeout: float
) -> ShutdownOutcome:
    """Renderer first, then the worker: a stop message, one deadline, then SIGKILL."""
    started = time.monotonic()
    renderer.shutdown()
    try:
        conn.send(None)
    except (BrokenPipeError, OSError):
        pass
    proc.join(timeout)
    killed: tuple[str, ...] = ()
    if proc.is_alive():
        killed = (str(proc.name),)
        proc.kill()
        proc.join(REAP_TIMEOUT_S)
    conn.close()
    return ShutdownOutcome(
        timeout=timeout,
        exitcodes={str(proc.name): proc.exitcode},
        force_killed=killed,
        duration_s=time.monotonic() - started,
    )


class MiniEngine:
    """A renderer and a worker process. ``shutdown()`` is idempotent; dropping it reaps both."""

    def __init__(
        self,
        *,
        num_workers: int = 2,
        request_timeout: float | None = 0.0,
        platform: str = "cpu",
        rocm_grace_s: float = ROCM_PROCESS_GRACE_S,
        default_process_timeout_s: float = DEFAULT_PROCESS_TIMEOUT_S,
        hang_on_stop: bool = False,
    ) -> None:
        self.request_timeout = request_timeout
        self.platform = platform
        self.rocm_grace_s = rocm_grace_s
        self.default_process_timeout_s = default_process_timeout_s
        self.last_outcome: ShutdownOutcome | None = None
        self.renderer = Renderer(num_workers)
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs threads
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=worker_main,
            args=(child_conn, os.getpid(), hang_on_stop),
            name="MiniEngine-worker",
            daemon=True,
        )
        # registered before start: a failed start is still cleaned up on collection
        self._finalizer = weakref.finalize(
            self, _stop_worker, self.renderer, self._proc, self._conn, default_process_timeout_s
        )
        self._proc.start()
        child_conn.close()
        if not self._conn.poll(STARTUP_TIMEOUT_S) or self._conn.recv() != "ready":
            self._finalizer()
            raise TimeoutError(f"MiniEngine worker not ready within {STARTUP_TIMEOUT_S} s")

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> MiniEngine:
        """Built from the reference engine's ``EngineConfig``, so one fixture drives both."""
        fields: dict[str, Any] = dict(
            num_workers=config.renderer_num_workers,
            request_timeout=config.shutdown_timeout,
            platform=config.resolved_platform,
            rocm_grace_s=config.rocm_process_grace_s,
            default_process_timeout_s=config.default_process_timeout_s,
        )
        fields.update(overrides)
        return cls(**fields)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def generate(self, prompt: str) -> list[int]:
        """Tokenize on the renderer, compute in the worker."""
        ids = self.renderer.encode(prompt).result(timeout=REPLY_TIMEOUT_S)
        self._conn.send(ids)
        if not self._conn.poll(REPLY_TIMEOUT_S):
            raise TimeoutError(f"no reply from the worker within {REPLY_TIMEOUT_S} s")
        reply: list[int] = self._conn.recv()
        return reply

    def shutdown(self, timeout: float | None = None) -> ShutdownOutcome | None:
        """Stop the renderer and the worker; later calls return the first call's outcome."""
        if self._finalizer.detach() is None:
            return self.last_outcome
        chosen = process_timeout_for(
            self.request_timeout, timeout, self.platform, self.rocm_grace_s
        )
        budget = self.default_process_timeout_s if chosen is None else chosen
        self.last_outcome = _stop_worker(self.renderer, self._proc, self._conn, budget)
        return self.last_outcome
