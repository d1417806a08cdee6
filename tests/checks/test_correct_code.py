"""Correct code is not accused: the bundled ReferenceRenderer and real third-party objects.

ThreadPoolExecutor, ProcessPoolExecutor, multiprocessing.Pool and torch's DataLoader iterator with
worker processes all have real, idempotent shutdown paths; every helper must let them pass.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest

from pytest_shutdown import (
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
)
from pytest_shutdown.helpers.finalization import check_finalizers


def _square(x: int) -> int:
    return x * x


# -- the bundled reference renderer -------------------------------------------------------------


@pytest.fixture
def renderer_cls() -> Any:
    # A plain import: torch is a dev requirement, and a broken engine import must fail, not skip.
    from pytest_shutdown.engine.renderer import ReferenceRenderer

    return ReferenceRenderer


def test_reference_renderer_idempotent_even_when_raced(renderer_cls: Any) -> None:
    renderer = renderer_cls()
    assert renderer.tokenize("hi").result(timeout=10) == [104, 105]
    report = assert_idempotent_shutdown(renderer, calls=3, threads=4)
    for label in ("_executor.shutdown", "_mm_executor.shutdown", "mm_cache.close"):
        assert report.cleanups[label]["call 1"] == 1, label
    assert renderer.mm_cache.close_calls == 1


def test_reference_renderer_finalizes_on_gc_with_the_same_cleanups(renderer_cls: Any) -> None:
    renderer = renderer_cls()
    try:
        assert check_finalizers(renderer) == []
    finally:
        renderer.shutdown()
    report = assert_finalizes_on_gc(renderer_cls)
    assert "mm_cache.close" in report.performed("gc")
    assert sorted(report.performed("gc")) == sorted(report.details["explicit_cleanups"])


def test_reference_renderer_shutdown_does_not_block_on_busy_pools(renderer_cls: Any) -> None:
    report = assert_nonblocking_shutdown(renderer_cls(), budget=2.0)
    assert sorted(report.details["executors"]) == ["_executor", "_mm_executor"]


# -- concurrent.futures -------------------------------------------------------------------------


def test_thread_pool_executor() -> None:
    pool = ThreadPoolExecutor(max_workers=2)
    assert pool.submit(_square, 3).result(timeout=10) == 9
    assert_idempotent_shutdown(pool)
    assert_finalizes_on_gc(lambda: ThreadPoolExecutor(max_workers=2))


def test_process_pool_executor() -> None:
    pool = ProcessPoolExecutor(max_workers=1)
    assert pool.submit(_square, 4).result(timeout=30) == 16
    report = assert_idempotent_shutdown(pool)
    assert "_result_queue.close" in report.performed("call 1")


class _ProcessPoolHolder:
    def __init__(self) -> None:
        self.pool = ProcessPoolExecutor(max_workers=1)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def test_process_pool_non_blocking_holder() -> None:
    assert_nonblocking_shutdown(_ProcessPoolHolder(), budget=2.0, grace=20.0)


# -- multiprocessing.Pool -----------------------------------------------------------------------


def test_multiprocessing_pool_terminate() -> None:
    pool = multiprocessing.get_context("fork").Pool(processes=2)
    assert pool.map(_square, [1, 2, 3], chunksize=1) == [1, 4, 9]
    report = assert_idempotent_shutdown(pool, method="terminate")
    assert "_pool[0].terminate" in report.cleanups
    assert check_finalizers(pool) == []


# -- torch DataLoader iterator with worker processes --------------------------------------------


def test_dataloader_iterator_with_workers() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    import torch

    dataset = torch_data.TensorDataset(torch.arange(8))
    loader = torch_data.DataLoader(dataset, batch_size=2, num_workers=2)

    iterator = iter(loader)
    assert next(iterator)[0].tolist() == [0, 1]
    report = assert_idempotent_shutdown(iterator, method="_shutdown_workers")
    assert any(label.startswith("_index_queues[") for label in report.performed("call 1"))

    def fresh() -> object:
        it = iter(loader)
        next(it)
        return it

    assert_finalizes_on_gc(fresh, method="_shutdown_workers", timeout=10.0)
