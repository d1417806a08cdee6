"""The reference engine's DP ranks as Ray actors on a local two-node cluster (``make ray-check``).

After a shutdown nothing of the engine may be left on the cluster (``ray-resource-left``): no
actor alive, placement groups removed, resources back to their baseline, no ``ray::`` worker
process. The orphan cells kill the driver (each signal, each phase), a node (``remove_node``)
and an actor's process; every time, the cluster must be clean within the deadline. Skipped
without Ray (``make test``): ``make ray-check`` runs them in .venv-ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

pytest.importorskip("ray", reason="Ray is not installed: these run in `make ray-check`")

from pytest_shutdown import assert_ray_released  # noqa: E402
from pytest_shutdown.engine import EngineConfig, RayEngine  # noqa: E402
from pytest_shutdown.engine.ray_engine import NAME_PREFIX  # noqa: E402
from pytest_shutdown.helpers.ray_resources import ray_leftovers  # noqa: E402
from pytest_shutdown.ownership.containment import started_in_test  # noqa: E402

CONFIG = EngineConfig(platform="cpu", data_parallel_size=2, kv_cache_bytes=1 << 16)
DEADLINE_S = 30.0

DRIVER = """
import sys, time
import ray
from pytest_shutdown.plugin.ray_cluster import LOOPBACK_ENV
from pytest_shutdown.engine import EngineConfig, RayEngine
ray.init(address=sys.argv[1])
engine = RayEngine(EngineConfig(platform="cpu", data_parallel_size=2, kv_cache_bytes=1 << 16))
print(engine.name, " ".join(map(str, engine.pids)), flush=True)
phase = sys.argv[2]
print("phase", phase, flush=True)
while True:
    if phase == "busy":
        engine.generate([1, 2, 3], 8)
    else:
        time.sleep(0.05)
"""


def test_a_shut_down_engine_leaves_nothing_on_the_cluster(ray_cluster: Any) -> None:
    engine = RayEngine(CONFIG)
    assert engine.generate([1, 2, 3], 3, rank=1)
    assert len(engine.pids) == 2
    engine.shutdown()
    assert_ray_released(engine.name, ray_cluster.baseline, pids=engine.pids,
                        deadline_s=DEADLINE_S)


@pytest.mark.parametrize("phase", ["ready", "busy"])
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_killing_the_driver_releases_its_actors_and_groups(
    ray_cluster: Any, phase: str, signum: int
) -> None:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, ray_cluster.address, phase],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        assert driver.stdout is not None
        name, pids = driver.stdout.readline().split(" ", 1)
        assert driver.stdout.readline().strip() == f"phase {phase}"
        time.sleep(0.5)
        driver.send_signal(signum)
        driver.wait(DEADLINE_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(5)
    assert name.startswith(NAME_PREFIX)
    assert ray_leftovers(name, ray_cluster.baseline, pids=map(int, pids.split()),
                         deadline_s=DEADLINE_S) == []


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_an_actor_whose_process_was_killed_still_shuts_down_clean(
    ray_cluster: Any, signum: int
) -> None:
    engine = RayEngine(CONFIG)
    os.kill(engine.pids[1], signum)
    started = time.monotonic()
    engine.shutdown(timeout_s=DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S + 5
    assert_ray_released(engine.name, ray_cluster.baseline, pids=engine.pids,
                        deadline_s=DEADLINE_S)


def test_an_engine_that_lost_a_node_still_shuts_down_clean(ray_cluster: Any) -> None:
    engine = RayEngine(CONFIG)
    try:
        ray_cluster.remove_node()
        started = time.monotonic()
        engine.shutdown(timeout_s=DEADLINE_S)
        assert time.monotonic() - started < DEADLINE_S + 5
        assert_ray_released(engine.name, None, pids=engine.pids, deadline_s=DEADLINE_S)
    finally:
        ray_cluster.restore()
    assert_ray_released(engine.name, ray_cluster.baseline, deadline_s=DEADLINE_S)


def test_no_process_of_the_cluster_names_a_test(ray_cluster: Any) -> None:
    """The nodes (the replacement one of the test above included) and the workers their raylets
    start are the fixture's: none names a test in its environment, or the guard would take a
    later test's actor for a late leak of the test during which its node was started."""
    engine = RayEngine(CONFIG)
    try:
        raylets = [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]
        assert len(raylets) == 2
        named = {pid: started_in_test(pid) for pid in (*raylets, *engine.pids)}
        assert named == dict.fromkeys(named)
    finally:
        engine.shutdown()
    assert_ray_released(engine.name, ray_cluster.baseline, pids=engine.pids,
                        deadline_s=DEADLINE_S)
