"""The helpers on third-party objects you already use: correct shutdown code passes.

concurrent.futures pools, multiprocessing.Pool and torch's DataLoader with worker processes all
have real, idempotent shutdown paths. Each test below is what you would write around your own
class that owns one of them; run under ``pytest -p shutdown``, the guard also checks that no
thread or worker process outlives the test.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from pytest_shutdown import (
    assert_finalizers_ok,
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
)


def square(x: int) -> int:
    return x * x


# -- concurrent.futures ---------------------------------------------------------------------------


def test_thread_pool_shutdown_is_idempotent_and_runs_on_gc() -> None:
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="example-tpe")
    assert pool.submit(square, 3).result(timeout=10) == 9

    # three calls, the first from four racing threads: its cleanups run once
    assert_idempotent_shutdown(pool, calls=3, threads=4)
    # dropped without shutdown(): collected, same cleanups as an explicit shutdown
    assert_finalizes_on_gc(lambda: ThreadPoolExecutor(max_workers=2))


class Tokenizer:
    """An engine-like owner of a pool: shutdown must not wait for running work."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenizer")

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def test_an_owner_of_a_thread_pool_shuts_down_without_blocking() -> None:
    # every pool thread is kept busy; shutdown() must return within 0.5 s anyway
    report = assert_nonblocking_shutdown(Tokenizer(), budget=0.5)
    assert report.details["executors"] == ["pool"]


def test_process_pool_shutdown_is_idempotent() -> None:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
    assert pool.submit(square, 4).result(timeout=30) == 16

    report = assert_idempotent_shutdown(pool)
    assert "_result_queue.close" in report.performed("call 1")


# -- multiprocessing.Pool -------------------------------------------------------------------------


def test_multiprocessing_pool_terminate_is_idempotent_and_its_finalizer_is_clean() -> None:
    pool = multiprocessing.get_context("fork").Pool(processes=2)
    assert pool.map(square, [1, 2, 3], chunksize=1) == [1, 4, 9]

    report = assert_idempotent_shutdown(pool, method="terminate")
    assert report.performed("call 1")  # terminate() did clean up, and only the first time
    # its multiprocessing.util.Finalize does not reach the pool itself
    assert_finalizers_ok(pool)


# -- torch DataLoader with worker processes -------------------------------------------------------


def test_dataloader_workers_shut_down_once_and_on_gc() -> None:
    data = pytest.importorskip("torch.utils.data", reason="needs torch (extra 'engine')")
    import torch

    loader = data.DataLoader(data.TensorDataset(torch.arange(8)), batch_size=2, num_workers=2)

    iterator = iter(loader)
    assert next(iterator)[0].tolist() == [0, 1]
    assert_idempotent_shutdown(iterator, method="_shutdown_workers")

    def started_iterator() -> object:
        it = iter(loader)
        next(it)
        return it

    # an iterator dropped half-way is collected and stops its workers (no zombie, no leak)
    assert_finalizes_on_gc(started_iterator, method="_shutdown_workers", timeout=10.0)
