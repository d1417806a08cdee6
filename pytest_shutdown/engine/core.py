"""EngineCore: a tiny torch model, a KV cache and a scheduler, with a correct shutdown.

The engine freezes its startup heap as vLLM does and ``shutdown()`` unfreezes it, unless the
heap was already frozen by someone else: the freeze is then not its own.
"""

from __future__ import annotations

import enum
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.start import heap_frozen_by_fork_server

logger = logging.getLogger("pytest_shutdown.engine")


class EngineShutdownState(enum.IntEnum):
    RUNNING = 0
    REQUESTED = 1
    SHUTTING_DOWN = 2


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    ABORTED = "aborted"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class EngineCoreOutput:
    """What one step reports for one request: its new tokens and, at the end, why it finished."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class TinyModel(torch.nn.Module):
    """Embedding + linear head: greedy next-token prediction, deterministic per seed."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(vocab_size, hidden_size)
        self.head = torch.nn.Linear(hidden_size, vocab_size)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(vocab_size, hidden_size, generator=generator))
            self.head.weight.copy_(torch.randn(vocab_size, hidden_size, generator=generator))
            self.head.bias.zero_()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(token_ids))


class EngineCore:
    """The in-process engine: ``add_request``, ``abort_requests``, ``step``, ``shutdown``."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self.device = torch.device(self.config.device)
        self.shutdown_state = EngineShutdownState.RUNNING
        self._requests: dict[str, Request] = {}
        self._pending_outputs: list[EngineCoreOutput] = []
        self._lock = threading.RLock()

        self._resources = ExitStack()
        # ExitStack.close is not safe against concurrent callers.
        self._shutdown_lock = threading.Lock()
        self._resources.callback(logger.info, "[shutdown] EngineCore")
        self._closed = threading.Event()
        self._resources.callback(self._closed.set)
        self._finalizer = weakref.finalize(self, self._resources.close)

        self.model: TinyModel | None = TinyModel(self.config.vocab_size, self.config.hidden_size)
        self.model.to(self.device).eval()
        self.kv_cache: torch.Tensor | None = torch.zeros(
            self.config.kv_cache_bytes // 4, dtype=torch.float32, device=self.device
        )
        # LIFO: the release runs first, the unfreeze last (after model and cache are gone).
        self._resources.callback(_unfreeze_if_frozen_by_us, _freeze_startup_heap())
        self._resources.callback(time.sleep, self.config.teardown_delay_s)
        self._resources.callback(_release, weakref.ref(self), self.device.type)

    def add_request(
        self, request_id: str, prompt_token_ids: Iterable[int], max_tokens: int = 16
    ) -> None:
        prompt = [int(t) % self.config.vocab_size for t in prompt_token_ids]
        if not prompt:
            raise ValueError(f"request {request_id!r}: the prompt has no tokens")
        if max_tokens < 1:
            raise ValueError(f"request {request_id!r}: max_tokens must be >= 1, got {max_tokens}")
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} already exists")
            self._requests[request_id] = Request(request_id, prompt, max_tokens)

    def abort_requests(self, request_ids: Iterable[str] | None = None) -> list[str]:
        """Finish the given unfinished requests (all when None) as ABORTED; returns their ids."""
        with self._lock:
            ids = list(self._requests) if request_ids is None else list(request_ids)
            aborted = []
            for rid in ids:
                request = self._requests.pop(rid, None)
                if request is None:
                    continue
                request.finish_reason = FinishReason.ABORTED
                self._pending_outputs.append(EngineCoreOutput(rid, [], FinishReason.ABORTED))
                aborted.append(rid)
            return aborted

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._requests) or bool(self._pending_outputs)

    def num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self._requests)

    def step(self) -> list[EngineCoreOutput]:
        """Generate one token for every running request; report finished ones once."""
        if self.config.step_delay_s:
            time.sleep(self.config.step_delay_s)
        with self._lock:
            if self.model is None:
                raise RuntimeError("EngineCore is shut down")
            outputs, self._pending_outputs = self._pending_outputs, []
            running = list(self._requests.values())
            if not running:
                return outputs
            last = [(r.output_token_ids or r.prompt_token_ids)[-1] for r in running]
            with torch.no_grad():
                logits = self.model(torch.tensor(last, device=self.device))
                next_tokens = logits.argmax(dim=-1).tolist()
            for request, token in zip(running, next_tokens, strict=True):
                request.output_token_ids.append(int(token))
                if len(request.output_token_ids) >= request.max_tokens:
                    request.finish_reason = FinishReason.LENGTH
                    del self._requests[request.request_id]
                outputs.append(
                    EngineCoreOutput(request.request_id, [int(token)], request.finish_reason)
                )
            return outputs

    def generate(self, prompt_token_ids: list[int], max_tokens: int = 16) -> list[int]:
        """Run one request to completion in-process (a convenience for tests and the facade)."""
        rid = f"gen-{id(prompt_token_ids)}-{time.monotonic_ns()}"
        self.add_request(rid, prompt_token_ids, max_tokens)
        tokens: list[int] = []
        while True:
            for out in self.step():
                if out.request_id == rid:
                    tokens.extend(out.new_token_ids)
                    if out.finished:
                        return tokens

    def shutdown(self) -> None:
        """Release model and KV cache and unfreeze the startup heap; later calls do nothing."""
        with self._shutdown_lock:
            self._resources.close()

    @property
    def is_shut_down(self) -> bool:
        return self._closed.is_set()

    def utility(self, name: str, *args: Any) -> Any:
        if name == "num_unfinished_requests":
            return self.num_unfinished_requests()
        if name == "has_work":
            return self.has_work()
        if name == "ping":
            return "pong"
        raise ValueError(
            f"unknown utility {name!r}; accepted: num_unfinished_requests, has_work, ping"
        )


def load_model(
    delay_s: float, interrupted: Callable[[], bool], wake: threading.Event, poll_s: float
) -> None:
    """Model loading: ``delay_s`` seconds, given up once ``interrupted()`` (checked every
    ``poll_s``; ``wake`` set cuts the wait short)."""
    until = time.monotonic() + delay_s
    while not interrupted():
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        wake.wait(min(remaining, poll_s))


def _freeze_startup_heap() -> bool:
    """True when this call did the freezing."""
    # Checked first: counting a frozen heap walks all of it (15-25 ms in a torch fork).
    if heap_frozen_by_fork_server() or gc.get_freeze_count() != 0:
        return False
    gc.collect()
    gc.freeze()
    return True


def _unfreeze_if_frozen_by_us(frozen_by_us: bool) -> None:
    if frozen_by_us:
        gc.unfreeze()


def _release(engine_ref: weakref.ReferenceType[EngineCore], device_type: str) -> None:
    engine = engine_ref()
    if engine is not None:
        with engine._lock:
            engine.model = None
            engine.kv_cache = None
    if device_type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
