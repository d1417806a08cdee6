"""A downstream suite: our own engine (mini_engine.py) under the helpers and the guard.

Run with ``pytest -p shutdown``: on top of what each test asserts, the guard fails any test that
leaves a thread, the worker process or a ``gc.freeze()`` behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from mini_engine import MiniEngine, Renderer, process_timeout_for

from pytest_shutdown import (
    ShutdownTimeouts,
    assert_finalizers_ok,
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_nonblocking_shutdown,
    assert_not_force_killed,
    assert_timeout_decoupling,
)


def test_generate_then_shut_down_three_times_from_racing_threads(mini_engine: MiniEngine) -> None:
    assert mini_engine.generate("hi") == [208, 210]

    report = assert_idempotent_shutdown(mini_engine, calls=3, threads=4)

    assert report.cleanups["renderer.shutdown"]["call 1"] == 1
    assert mini_engine.renderer.cache.close_calls == 1


def test_our_finalizers_do_not_keep_the_engine_alive(mini_engine: MiniEngine) -> None:
    # raises with every finding's whole message (the list is the error's `.findings`)
    assert_finalizers_ok(mini_engine)
    assert_finalizers_ok(mini_engine.renderer)


def test_a_dropped_engine_is_collected_and_reaps_its_worker() -> None:
    report = assert_finalizes_on_gc(MiniEngine, timeout=10.0)
    # the GC path ran what an explicit shutdown() runs
    assert "renderer.shutdown" in report.performed("gc")


# -- the renderer beside the bundled reference: the same contracts ------------------------------


@pytest.fixture(params=["ours", "reference"])
def make_renderer(request: pytest.FixtureRequest, engine_config: Any) -> Callable[[], Any]:
    if request.param == "ours":
        return lambda: Renderer(engine_config.renderer_num_workers)
    # Skip only when torch (the 'engine' extra) is missing; a broken engine import still fails.
    pytest.importorskip("torch", reason="the reference renderer needs torch (extra 'engine')")
    from pytest_shutdown.engine import ReferenceRenderer

    return lambda: ReferenceRenderer(engine_config)


def test_renderer_shutdown_is_idempotent(make_renderer: Callable[[], Any]) -> None:
    assert_idempotent_shutdown(make_renderer(), calls=3, threads=4)


def test_renderer_is_finalized_with_the_same_cleanups(make_renderer: Callable[[], Any]) -> None:
    report = assert_finalizes_on_gc(make_renderer)
    assert sorted(report.performed("gc")) == sorted(report.details["explicit_cleanups"])


def test_renderer_shutdown_does_not_wait_for_busy_threads(
    make_renderer: Callable[[], Any],
) -> None:
    assert_nonblocking_shutdown(make_renderer(), budget=0.5)


# -- timeouts: the policy on its own, then the real engine over a matrix ------------------------


def test_our_timeout_policy_decouples_request_and_process_timeouts() -> None:
    assert_timeout_decoupling(process_timeout_for, grace=15.0)


@pytest.mark.shutdown_matrix(request=[0, 1.0], process=[None, 0, 2.0], grace=1.0)
def test_the_engine_uses_the_process_timeout_of_each_cell(
    mini_engine: MiniEngine, shutdown_timeouts: ShutdownTimeouts, expect_force_kill: Any
) -> None:
    expected = shutdown_timeouts.expected_process_timeout
    # a zero process timeout kills the worker at once: that is the contract, not a bug
    expect_force_kill(expected == 0)

    outcome = mini_engine.shutdown(timeout=shutdown_timeouts.process_timeout)

    assert outcome is not None
    default = mini_engine.default_process_timeout_s
    assert outcome.timeout == (default if expected is None else expected)


@pytest.mark.expect_force_kill(reason="the worker ignores the stop request and SIGTERM")
def test_a_hung_worker_is_force_killed_within_its_budget() -> None:
    engine = MiniEngine(hang_on_stop=True)

    outcome = engine.shutdown(timeout=0.5)

    assert outcome is not None and outcome.duration_s < 5.0
    assert_not_force_killed(outcome, expected=True)
