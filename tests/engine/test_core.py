"""EngineCore runs requests on a real torch model; shutdown is idempotent, restores the heap."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import torch

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore, EngineShutdownState, FinishReason


@pytest.fixture
def core():
    engine = EngineCore(EngineConfig(platform="cpu"))
    yield engine
    engine.shutdown()


def _drain(engine: EngineCore, limit: int = 1000) -> dict[str, list]:
    finished: dict[str, list] = {}
    tokens: dict[str, list[int]] = {}
    for _ in range(limit):
        if not engine.has_work():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = [out.finish_reason, tokens[out.request_id]]
    assert not engine.has_work(), "the engine still had work after the step limit"
    return finished


def test_model_and_kv_cache_live_on_the_configured_device(core: EngineCore) -> None:
    assert core.shutdown_state is EngineShutdownState.RUNNING
    assert core.kv_cache is not None and core.kv_cache.device.type == "cpu"
    assert core.kv_cache.numel() * 4 == core.config.kv_cache_bytes
    assert next(core.model.parameters()).device.type == "cpu"  # type: ignore[union-attr]


def test_requests_run_to_completion_with_one_token_per_step(core: EngineCore) -> None:
    core.add_request("a", [1, 2, 3], max_tokens=4)
    core.add_request("b", [7], max_tokens=2)
    assert core.has_work()
    finished = _drain(core)
    assert finished["a"][0] is FinishReason.LENGTH and len(finished["a"][1]) == 4
    assert finished["b"][0] is FinishReason.LENGTH and len(finished["b"][1]) == 2


def test_generation_is_deterministic_greedy_decoding(core: EngineCore) -> None:
    first = core.generate([5, 6, 7], max_tokens=5)
    second = core.generate([5, 6, 7], max_tokens=5)
    assert first == second and len(first) == 5
    with torch.no_grad():
        expected = core.model(torch.tensor([7])).argmax(-1).item()  # type: ignore[misc]
    assert first[0] == expected


def test_abort_finishes_requests_as_aborted_and_leaves_no_work(core: EngineCore) -> None:
    core.add_request("keep", [1], max_tokens=3)
    core.add_request("drop", [2], max_tokens=100)
    core.step()
    assert core.abort_requests(["drop", "unknown"]) == ["drop"]
    finished = _drain(core)
    assert finished["drop"][0] is FinishReason.ABORTED
    assert finished["keep"][0] is FinishReason.LENGTH


def test_abort_all(core: EngineCore) -> None:
    for i in range(3):
        core.add_request(f"r{i}", [i + 1], max_tokens=50)
    assert sorted(core.abort_requests()) == ["r0", "r1", "r2"]
    finished = _drain(core)
    assert {v[0] for v in finished.values()} == {FinishReason.ABORTED}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_token_ids": [], "max_tokens": 1}, "no tokens"),
        ({"prompt_token_ids": [1], "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_requests_are_rejected(core: EngineCore, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        core.add_request("x", **kwargs)


def test_duplicate_request_ids_are_rejected(core: EngineCore) -> None:
    core.add_request("x", [1])
    with pytest.raises(ValueError, match="already exists"):
        core.add_request("x", [1])


def test_startup_freezes_the_heap_and_shutdown_restores_the_freeze_count() -> None:
    before = gc.get_freeze_count()
    assert before == 0, "another test left a gc.freeze() behind"
    engine = EngineCore(EngineConfig(platform="cpu"))
    assert gc.get_freeze_count() > 0, "EngineCore did not freeze its startup heap"
    engine.shutdown()
    assert gc.get_freeze_count() == before
    engine.shutdown()
    assert gc.get_freeze_count() == before


def test_a_heap_frozen_by_someone_else_is_left_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        engine = EngineCore(EngineConfig(platform="cpu"))
        engine.shutdown()
        assert gc.get_freeze_count() >= frozen, "EngineCore unfroze a freeze it did not make"
    finally:
        gc.unfreeze()


def test_shutdown_is_idempotent_and_releases_model_and_cache() -> None:
    engine = EngineCore(EngineConfig(platform="cpu"))
    kv = weakref.ref(engine.kv_cache)  # type: ignore[arg-type]
    model = weakref.ref(engine.model)  # type: ignore[arg-type]
    engine.shutdown()
    engine.shutdown()
    assert engine.is_shut_down
    assert engine.model is None and engine.kv_cache is None
    gc.collect()
    assert kv() is None and model() is None, "model or KV cache still referenced after shutdown"
    with pytest.raises(RuntimeError, match="shut down"):
        engine.step()


def test_concurrent_shutdowns_release_once_and_honour_the_teardown_delay() -> None:
    engine = EngineCore(EngineConfig(platform="cpu", teardown_delay_s=0.3))
    started = time.monotonic()
    threads = [threading.Thread(target=engine.shutdown) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.2, f"teardown delay ran {elapsed / 0.3:.1f} times"
    assert engine.is_shut_down and gc.get_freeze_count() == 0


def test_dropped_engine_is_collected_and_unfreezes() -> None:
    engine = EngineCore(EngineConfig(platform="cpu"))
    ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None
    assert gc.get_freeze_count() == 0


def test_forced_rocm_on_a_cpu_machine_keeps_tensors_on_the_cpu() -> None:
    engine = EngineCore(EngineConfig(platform="rocm"))
    try:
        assert engine.config.resolved_platform == "rocm"
        assert engine.kv_cache is not None and engine.kv_cache.device.type == "cpu"
    finally:
        engine.shutdown()


def test_utility_calls() -> None:
    engine = EngineCore(EngineConfig(platform="cpu"))
    try:
        assert engine.utility("ping") == "pong"
        assert engine.utility("has_work") is False
        with pytest.raises(ValueError, match="accepted"):
            engine.utility("nope")
    finally:
        engine.shutdown()
