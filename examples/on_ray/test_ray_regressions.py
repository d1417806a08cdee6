"""Engines on Ray: a placement group never removed (ray #64035), an actor left after a failed
test (ray #31738). Each bug is a strict xfail beside the fixed engine (``make ray-check``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed: these run in `make ray-check`")

from pytest_shutdown import ShutdownContractError, assert_ray_released  # noqa: E402
from pytest_shutdown.engine import EngineConfig, RayEngine, RayFaults  # noqa: E402
from pytest_shutdown.harness import release_ray_leftovers  # noqa: E402

CONFIG = EngineConfig(platform="cpu", data_parallel_size=2, kv_cache_bytes=1 << 16)


def failing_test_body(engine_faults: RayFaults) -> str:
    """A test that starts an engine and fails before it shuts it down; returns the engine's name."""
    engine = RayEngine(CONFIG, faults=engine_faults)
    name = engine.name
    try:
        engine.generate([1, 2], 2)
        raise RuntimeError("the test failed here")
    except RuntimeError:
        return name  # the engine object goes: only a finalizer can release it now


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="groups are never removed")
def test_placement_groups_left_after_shutdown(ray_cluster: Any) -> None:
    engine = RayEngine(CONFIG, faults=RayFaults(keep_placement_groups=True))
    engine.shutdown()
    try:
        assert_ray_released(engine.name, ray_cluster.baseline, deadline_s=5.0)
    except ShutdownContractError as error:
        assert {f.details["kind"] for f in error.findings} == {"placement_group", "resources"}
        raise
    finally:
        release_ray_leftovers(engine.name)


def test_placement_groups_removed_with_the_actors(ray_cluster: Any) -> None:
    engine = RayEngine(CONFIG)
    engine.shutdown()
    assert_ray_released(engine.name, ray_cluster.baseline, pids=engine.pids)


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="detached actors outlive it")
def test_detached_actors_outlive_a_failed_test(ray_cluster: Any) -> None:
    name = failing_test_body(RayFaults(detached=True))
    try:
        assert_ray_released(name, ray_cluster.baseline, deadline_s=5.0)
    except ShutdownContractError as error:
        assert "actor" in {f.details["kind"] for f in error.findings}
        raise
    finally:
        release_ray_leftovers(name)


def test_owned_actors_go_with_the_engine_of_a_failed_test(ray_cluster: Any) -> None:
    name = failing_test_body(RayFaults())
    assert_ray_released(name, ray_cluster.baseline)
