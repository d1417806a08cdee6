"""ReferenceLLM: the user-facing facade of the reference engine (the renderer's resource
pattern: one ExitStack, ``weakref.finalize(self, self._resources.close)``)."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore, FinishReason
from pytest_shutdown.engine.processes import EngineProcManager, validate_timeout
from pytest_shutdown.engine.renderer import ReferenceRenderer

logger = logging.getLogger("pytest_shutdown.engine")

GENERATE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's result: the generated token ids and their text."""

    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None


def _shutdown_manager(manager: EngineProcManager, cell: list[float | None]) -> None:
    """``cell[0]``: the process timeout of this close of the stack (None on the GC path)."""
    manager.shutdown(cell[0])


class ReferenceLLM:
    """Generate text with the reference engine; ``shutdown()`` or ``with`` to stop it."""

    def __init__(self, config: EngineConfig | None = None, *, multiprocess: bool = True) -> None:
        self.config = config if config is not None else EngineConfig()
        self.multiprocess = multiprocess
        self._resources = ExitStack()
        self._resources.callback(logger.info, "[shutdown] ReferenceLLM")
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._timeout: list[float | None] = [None]
        self._lock = threading.Lock()
        self._ids = itertools.count()

        renderer = ReferenceRenderer(self.config)
        self._resources.callback(renderer.shutdown)
        self.renderer = renderer
        self.manager: EngineProcManager | None = None
        self.engine_core: EngineCore | None = None
        try:
            if multiprocess:
                manager = EngineProcManager(self.config)
                self._resources.callback(_shutdown_manager, manager, self._timeout)
                self.manager = manager
            else:
                core = EngineCore(self.config)
                self._resources.callback(core.shutdown)
                self.engine_core = core
        except BaseException:
            self._finalizer()  # what was built (the renderer) is released now, not at GC
            raise

    def generate(
        self,
        prompts: str | Sequence[str],
        max_tokens: int = 16,
        *,
        timeout: float = GENERATE_TIMEOUT_S,
    ) -> list[RequestOutput]:
        """One output per prompt, in order; waits at most ``timeout`` seconds."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: expected a positive integer, got {max_tokens!r}")
        if self.is_shut_down:
            raise RuntimeError("ReferenceLLM is shut down")
        deadline = time.monotonic() + timeout
        with self._lock:
            futures = [self.renderer.tokenize(p) for p in prompts]
            token_lists = [f.result(_remaining(deadline)) for f in futures]
            for prompt, tokens in zip(prompts, token_lists, strict=True):
                if not tokens:
                    raise ValueError(f"prompts: cannot generate from an empty prompt {prompt!r}")
            ids = [f"llm-{next(self._ids)}" for _ in prompts]
            if self.manager is not None:
                results = self._generate_multiprocess(ids, token_lists, max_tokens, deadline)
            else:
                results = self._generate_in_process(ids, token_lists, max_tokens)
            texts = [self.renderer.detokenize(results[rid][0]) for rid in ids]
            return [
                RequestOutput(
                    rid, prompt, tokens, results[rid][0], text.result(_remaining(deadline)),
                    results[rid][1],
                )
                for rid, prompt, tokens, text in zip(ids, prompts, token_lists, texts, strict=True)
            ]

    def _generate_multiprocess(
        self, ids: list[str], token_lists: list[list[int]], max_tokens: int, deadline: float
    ) -> dict[str, tuple[list[int], FinishReason | None]]:
        manager = self.manager
        assert manager is not None
        results: dict[str, tuple[list[int], FinishReason | None]] = {}
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        for rid, prompt in zip(ids, token_lists, strict=True):
            manager.add_request(rid, prompt, max_tokens)
        while len(results) < len(ids):
            if manager.failures:
                raise RuntimeError(f"engine process failed: {manager.failures[0]}")
            try:
                out = manager.outputs.get(timeout=min(0.5, _remaining(deadline)))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    manager.abort_requests([r for r in ids if r not in results])
                    raise TimeoutError(
                        f"generate: {len(ids) - len(results)} of {len(ids)} request(s) "
                        "unfinished at the deadline; pass a larger timeout="
                    ) from None
                continue
            if out.request_id not in tokens:
                continue  # a stale output of an earlier, abandoned call
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                results[out.request_id] = (tokens[out.request_id], out.finish_reason)
        return results

    def _generate_in_process(
        self, ids: list[str], token_lists: list[list[int]], max_tokens: int
    ) -> dict[str, tuple[list[int], FinishReason | None]]:
        core = self.engine_core
        assert core is not None
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        results: dict[str, tuple[list[int], FinishReason | None]] = {}
        for rid, prompt in zip(ids, token_lists, strict=True):
            core.add_request(rid, prompt, max_tokens)
        while len(results) < len(ids):
            for out in core.step():
                if out.request_id in tokens:
                    tokens[out.request_id].extend(out.new_token_ids)
                    if out.finished:
                        results[out.request_id] = (tokens[out.request_id], out.finish_reason)
        return results

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the engine (process timeout ``timeout``) and the renderer; then do nothing."""
        self._timeout[0] = validate_timeout(timeout)
        self._finalizer()  # runs self._resources.close() once, and marks the finalizer dead

    @property
    def is_shut_down(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> ReferenceLLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
