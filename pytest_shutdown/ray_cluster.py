"""The ``ray_cluster`` fixture: a local two-node Ray cluster, CPU only, dashboard off, loopback.

Two simulated nodes (``ray.cluster_utils.Cluster``: a head and one worker node, ``num_cpus`` each,
no GPU), every address on 127.0.0.1 (Ray's "local cluster" mode), the pytest process connected
as the driver. Session scope (a cluster takes tens of seconds to start); ``baseline`` is the
cluster's available resources when it was ready, for ``assert_ray_released``. ``remove_node()``
takes the worker node away (a node failure) and ``restore()`` puts one back. Ray is imported when
the fixture is first used; without it the test skips, naming the extra to install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import field
from typing import Any

import pytest

from pytest_shutdown.lazy_dataclass import lazy_dataclass

#: Ray binds every node to the loopback in this mode, even on Linux.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
CPUS_PER_NODE = 2
SKIP_REASON = (
    "the ray_cluster fixture needs Ray: pip install 'pytest-shutdown[ray]' (`make ray-check` "
    "builds .venv-ray with it)"
)


@lazy_dataclass
class RayCluster:
    """A started local cluster: its ``address``, the driver's ``baseline`` resources."""

    cluster: Any
    address: str
    baseline: dict[str, float]
    worker_nodes: list[Any] = field(default_factory=list)

    def remove_node(self) -> None:
        """Kill the worker node's processes (its raylet and its workers), as a node failure."""
        node = self.worker_nodes.pop()
        self.cluster.remove_node(node, allow_graceful=False)

    def restore(self) -> None:
        """Put a worker node back after ``remove_node``; wait until the cluster sees it."""
        while len(self.worker_nodes) < 1:
            self.worker_nodes.append(
                self.cluster.add_node(num_cpus=CPUS_PER_NODE, node_ip_address="127.0.0.1")
            )
        self.cluster.wait_for_nodes()


def start_cluster() -> RayCluster:
    os.environ.update(LOOPBACK_ENV)  # for Ray's own processes (they read it at import)
    import ray  # noqa: PLC0415
    from ray._private import ray_constants  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray before, maybe
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": CPUS_PER_NODE, "num_gpus": 0, "include_dashboard": False,
                        "node_ip_address": "127.0.0.1"},
    )
    try:
        worker = cluster.add_node(num_cpus=CPUS_PER_NODE, num_gpus=0,
                                  node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False)
    except BaseException:
        cluster.shutdown()
        raise
    return RayCluster(cluster, cluster.address, dict(ray.available_resources()), [worker])


def stop_cluster(started: RayCluster) -> None:
    import ray  # noqa: PLC0415

    try:
        ray.shutdown()
    finally:
        started.cluster.shutdown()


def running_cluster() -> Iterator[RayCluster]:
    """The ``ray_cluster`` fixture (:mod:`pytest_shutdown.fixtures`): a started cluster, stopped
    when the generator is closed or exhausted."""
    pytest.importorskip("ray", reason=SKIP_REASON)
    started = start_cluster()
    try:
        yield started
    finally:
        stop_cluster(started)
