"""The ``ray_cluster`` fixture: a local two-node Ray cluster, CPU only, dashboard off, loopback.

Two simulated nodes (``ray.cluster_utils.Cluster``: a head and one worker node, ``num_cpus`` each,
no GPU), every address on 127.0.0.1 (Ray's "local cluster" mode), the pytest process connected
as the driver. Session scope (a cluster takes tens of seconds to start); ``baseline`` is the
cluster's available resources when it was ready, for ``assert_ray_released``. ``remove_node()``
takes the worker node away (a node failure) and ``restore()`` puts one back. Ray is imported when
the fixture is first used; without it the test skips, naming the extra to install.

The set-up does what Ray starts once per process, so that it is the fixture's (the guard's
wider-scope accounting), not the first test's: ``ray.init`` and one actor call (the driver's
connections Ray opens on first use). The teardown stops the cluster, drops every reference to
it, unregisters the nodes' ``atexit`` hooks (each keeps its ``Node`` alive) and puts back what
``ray.init`` and the nodes changed: the SIGTERM handler, ``PYTHONBREAKPOINT`` and
:data:`LOOPBACK_ENV`.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
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
    #: The process-wide state before the set-up (SIGTERM handler, environment), put back by
    #: ``stop_cluster``; the ``atexit`` hooks Ray registered meanwhile, unregistered there.
    saved: dict[str, Any] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)

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


#: The environment variables ``start_cluster`` (and ``ray.init``) set, put back at the end.
SAVED_ENV = (*LOOPBACK_ENV, "PYTHONBREAKPOINT")


def start_cluster() -> RayCluster:
    from pytest_shutdown import atexit_calls  # noqa: PLC0415

    saved: dict[str, Any] = {"SIGTERM": signal.getsignal(signal.SIGTERM)}
    saved.update({name: os.environ.get(name) for name in SAVED_ENV})
    os.environ.update(LOOPBACK_ENV)  # for Ray's own processes (they read it at import)
    import ray  # noqa: PLC0415
    from ray._private import ray_constants  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray before, maybe
    with atexit_calls.recording():  # the nodes' atexit hooks, to unregister at the end
        first = atexit_calls.count()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": CPUS_PER_NODE, "num_gpus": 0, "include_dashboard": False,
                            "node_ip_address": "127.0.0.1"},
        )
        started = RayCluster(cluster, cluster.address, {}, [], saved)
        try:
            started.worker_nodes.append(
                cluster.add_node(num_cpus=CPUS_PER_NODE, num_gpus=0, node_ip_address="127.0.0.1")
            )
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, include_dashboard=False)
            _first_use(ray)
        except BaseException:
            started.hooks = _node_hooks(atexit_calls.since(first))
            stop_cluster(started)
            raise
        started.hooks = _node_hooks(atexit_calls.since(first))
    started.baseline = dict(ray.available_resources())
    # The session's own SIGTERM handler again (pytest-shutdown's ends the session in order, and
    # this fixture's teardown stops the cluster): ray.init's and the head node's only exit.
    _put_back_sigterm(saved)
    return started


def _node_hooks(registrations: list[Any]) -> list[Any]:
    """The ``atexit`` hooks among ``registrations`` that hold one of Ray's ``Node`` objects."""
    from pytest_shutdown.atexit_calls import reached_objects  # noqa: PLC0415

    def holds_node(registration: Any) -> bool:
        return any(
            type(held).__name__ == "Node" and type(held).__module__.startswith("ray.")
            for held in reached_objects(registration)
        )

    return [r.func for r in registrations if holds_node(r)]


def _put_back_sigterm(saved: dict[str, Any]) -> None:
    if "SIGTERM" in saved and signal.getsignal(signal.SIGTERM) is not saved["SIGTERM"]:
        signal.signal(signal.SIGTERM, saved["SIGTERM"])


def _first_use(ray: Any) -> None:
    """One actor call: the driver's connections and threads Ray opens on first use are the
    set-up's, not the first test's."""

    @ray.remote(num_cpus=0)
    class Warm:
        def pid(self) -> int:
            return os.getpid()

    actor = Warm.remote()  # type: ignore[attr-defined]
    ray.get(actor.pid.remote(), timeout=60)
    ray.kill(actor)


def stop_cluster(started: RayCluster) -> None:
    """Shut the driver and the cluster down, then put back what the set-up changed."""
    import ray  # noqa: PLC0415

    try:
        ray.shutdown()
    finally:
        try:
            started.cluster.shutdown()
        finally:
            _put_back(started)


def _put_back(started: RayCluster) -> None:
    for hook in started.hooks:  # each one holds a stopped Node (and its clients) alive
        atexit.unregister(hook)
    started.hooks.clear()
    started.worker_nodes.clear()
    started.cluster = None
    saved = started.saved
    _put_back_sigterm(saved)
    for name in SAVED_ENV:
        if name not in saved:
            continue
        if saved[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved[name]
    gc.collect()  # the nodes' GCS clients end their threads and close their descriptors


def running_cluster() -> Iterator[RayCluster]:
    """The ``ray_cluster`` fixture (:mod:`pytest_shutdown.fixtures`): a started cluster, stopped
    when the generator is closed or exhausted."""
    pytest.importorskip("ray", reason=SKIP_REASON)
    started = start_cluster()
    try:
        yield started
    finally:
        stop_cluster(started)
