"""The ``ray_cluster`` fixture: a local two-node Ray cluster, CPU only, dashboard off, loopback.

Session scope; ``baseline`` is the available resources once ready (for ``assert_ray_released``),
``remove_node()`` is a node failure and ``restore()`` puts a node back. The set-up does what Ray
starts once per process (``ray.init``, one actor call), so that it is the fixture's, not the
first test's; no node's environment names a test. The teardown stops every node, drops every
reference and puts back what ``ray.init`` and the nodes changed (SIGTERM handler, environment).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import field
from typing import Any

import pytest

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass

#: Ray binds every node to the loopback in this mode, even on Linux.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: pytest's name of the running test, which an executed program inherits: no node carries it.
CURRENT_TEST_VAR = "PYTEST_CURRENT_TEST"
CPUS_PER_NODE = 2
#: How long a replacement node may take to start, and to stop before its processes are killed.
NODE_START_S = 60.0
NODE_STOP_S = 20.0
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
    #: What the set-up changed (SIGTERM handler, environment) and the cluster's ``atexit``
    #: hook: put back and unregistered by ``stop_cluster``.
    saved: dict[str, Any] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)

    def remove_node(self) -> None:
        """Kill the worker node's processes (its raylet and its workers), as a node failure."""
        node = self.worker_nodes.pop()
        if isinstance(node, NodeProcess):
            node.kill()
        else:
            self.cluster.remove_node(node, allow_graceful=False)

    def restore(self) -> None:
        """Put a worker node back after ``remove_node``; wait until the cluster sees it. It runs
        in a child process (:class:`NodeProcess`): the fixture's, not the calling test's."""
        while len(self.worker_nodes) < 1:
            self.worker_nodes.append(NodeProcess.start(self.address))


@lazy_dataclass
class NodeProcess:
    """A worker node in a child process of its own session (:data:`NODE_SCRIPT`): a node
    failure kills its process group, the teardown SIGTERMs it."""

    process: Any
    node_id: str

    @classmethod
    def start(cls, address: str, timeout_s: float = NODE_START_S) -> NodeProcess:
        import ray  # noqa: PLC0415

        env = {**os.environ, **LOOPBACK_ENV}
        env.pop(CURRENT_TEST_VAR, None)  # the fixture's node, not the calling test's
        process = subprocess.Popen(
            [sys.executable, "-c", NODE_SCRIPT, address, str(CPUS_PER_NODE)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )
        started = cls(process, "")
        try:
            assert process.stdout is not None
            deadline = time.monotonic() + timeout_s
            ready, _, _ = select.select([process.stdout], [], [], timeout_s)
            line = process.stdout.readline().strip() if ready else ""
            if not line:
                raise RuntimeError(f"the replacement node did not start in {timeout_s:.0f} s")
            started.node_id = line
            while not any(
                n["NodeID"] == line and n["Alive"] for n in ray.nodes()
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not see node {line} in {timeout_s:.0f} s")
                time.sleep(0.1)
        except BaseException:
            started.stop()
            raise
        return started

    def kill(self) -> None:
        """A node failure: SIGKILL to every process of the node at once."""
        self.stop(timeout_s=None)

    def stop(self, timeout_s: float | None = NODE_STOP_S) -> None:
        """SIGTERM (the node kills its raylet and workers, then exits); the process group
        killed after ``timeout_s`` (None: at once)."""
        if timeout_s is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
        with contextlib.suppress(OSError):  # whatever of the node outlived it
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


#: A worker node in its own process: ``ray.cluster_utils.Cluster.add_node``'s settings, its
#: node id printed once it runs; SIGTERM stops it (the node's own handler).
NODE_SCRIPT = """
import signal, sys
from ray._private.node import Node
from ray._private.parameter import RayParams
params = RayParams(
    gcs_address=sys.argv[1], num_cpus=int(sys.argv[2]), num_gpus=0,
    node_ip_address="127.0.0.1", object_store_memory=150 * 1024 * 1024,
    min_worker_port=0, max_worker_port=0, include_log_monitor=False, node_manager_port=0,
)
params.dashboard_agent_listen_port = None
node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=False)
print(node.node_id, flush=True)
while True:
    signal.pause()
"""


#: The environment variables ``start_cluster`` (and ``ray.init``) set, put back at the end.
SAVED_ENV = (*LOOPBACK_ENV, "PYTHONBREAKPOINT")


@contextlib.contextmanager
def _naming_no_test() -> Iterator[None]:
    """``PYTEST_CURRENT_TEST`` out of the environment meanwhile: the nodes (and every worker
    their raylets start later) would inherit it, and the guard would blame a later test's actor
    on the test during whose set-up the cluster started."""
    current = os.environ.pop(CURRENT_TEST_VAR, None)
    try:
        yield
    finally:
        if current is not None:
            os.environ[CURRENT_TEST_VAR] = current


def start_cluster() -> RayCluster:
    from pytest_shutdown.ownership import atexit_calls  # noqa: PLC0415

    saved: dict[str, Any] = {"SIGTERM": signal.getsignal(signal.SIGTERM)}
    saved.update({name: os.environ.get(name) for name in SAVED_ENV})
    os.environ.update(LOOPBACK_ENV)  # for Ray's own processes (they read it at import)
    import ray  # noqa: PLC0415
    from ray._private import ray_constants  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported Ray before, maybe
    with _naming_no_test(), atexit_calls.recording():  # the nodes' atexit hooks: unregistered
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
            _swap_node_hooks(started, _node_hooks(atexit_calls.since(first)))
            stop_cluster(started)
            raise
        _swap_node_hooks(started, _node_hooks(atexit_calls.since(first)))
    started.baseline = dict(ray.available_resources())
    # The session's own SIGTERM handler again (pytest-shutdown's ends the session in order, and
    # this fixture's teardown stops the cluster): ray.init's and the head node's only exit.
    _put_back_sigterm(saved)
    return started


def _node_hooks(registrations: list[Any]) -> list[Any]:
    """The ``atexit`` hooks among ``registrations`` that hold one of Ray's ``Node`` objects."""
    from pytest_shutdown.ownership.atexit_calls import reached_objects  # noqa: PLC0415

    def holds_node(registration: Any) -> bool:
        return any(
            type(held).__name__ == "Node" and type(held).__module__.startswith("ray.")
            for held in reached_objects(registration)
        )

    return [r.func for r in registrations if holds_node(r)]


def _swap_node_hooks(started: RayCluster, hooks: list[Any]) -> None:
    """Swap the nodes' ``atexit`` hooks for one of the cluster's own (it stops the cluster at
    exit if the teardown never ran). Each node's hook holds its ``Node`` and GCS client (a
    native thread) alive past the teardown's check; the cluster's holds no node after it."""
    for hook in hooks:
        atexit.unregister(hook)
    if not started.hooks:
        hook = functools.partial(_stop_at_exit, started)
        atexit.register(hook)
        started.hooks.append(hook)


def _stop_at_exit(started: RayCluster) -> None:
    if started.cluster is not None:
        stop_cluster(started)


def _put_back_sigterm(saved: dict[str, Any]) -> None:
    if "SIGTERM" in saved and signal.getsignal(signal.SIGTERM) is not saved["SIGTERM"]:
        signal.signal(signal.SIGTERM, saved["SIGTERM"])


def _first_use(ray: Any) -> None:
    """One actor call: what Ray opens on first use is the set-up's, not the first test's."""

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
            for node in started.worker_nodes:  # a replacement node first: the head is its GCS
                if isinstance(node, NodeProcess):
                    node.stop()
        finally:
            try:
                started.cluster.shutdown()
            finally:
                _put_back(started)


def _put_back(started: RayCluster) -> None:
    for hook in started.hooks:  # the cluster's own (see _swap_node_hooks)
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
    """The ``ray_cluster`` fixture's value: a started cluster, stopped when the generator ends."""
    pytest.importorskip("ray", reason=SKIP_REASON)
    started = start_cluster()
    try:
        yield started
    finally:
        stop_cluster(started)
