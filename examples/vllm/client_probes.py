"""What the checks of vLLM's async client look at: a started client, its open sockets, whether
its zmq context can terminate."""

from __future__ import annotations

import threading
from typing import Any

import zmq
from model_free import make_async_client
from vllm.v1.engine.core_client import BackgroundResources

#: The version the checks set on the engine and read back (a utility call each way).
WEIGHT_VERSION = "model-free"


async def started_client(resources: type[BackgroundResources] = BackgroundResources) -> Any:
    """An ``AsyncMPClient`` built on the running loop (its output queue task starts there), which
    has answered two utility calls through the EngineCore's sockets and its own output task."""
    client = make_async_client(resources)
    await client.set_weight_version_async(WEIGHT_VERSION)
    assert await client.get_weight_version_async() == WEIGHT_VERSION
    return client


async def shut_down_client(resources: type[BackgroundResources] = BackgroundResources) -> Any:
    """A :func:`started_client` after its ``shutdown()``, on its loop."""
    client = await started_client(resources)
    client.shutdown()
    return client


def open_sockets(client: Any) -> list[str]:
    """The sockets made on the client's context that are still open (type and endpoint)."""
    # pyzmq keeps a weak set of the sockets each context made; it has no public accessor
    sockets = [s for s in list(getattr(client.ctx, "_sockets", ())) if not s.closed]
    return [f"{s.type.name} {s.getsockopt(zmq.LAST_ENDPOINT).decode()}" for s in sockets]


def open_socket_types(client: Any) -> list[str]:
    """The types of the client's open sockets, sorted (``["PULL", "ROUTER"]``)."""
    return sorted(socket.split()[0] for socket in open_sockets(client))


def close_open_sockets(client: Any) -> None:
    """Close what the client left open (linger 0), so that its context can terminate."""
    for socket in list(getattr(client.ctx, "_sockets", ())):
        socket.close(linger=0)


def term_within(ctx: zmq.Context, deadline_s: float) -> bool:
    """Terminate ``ctx`` on a daemon thread; True when ``term()`` returned within the deadline
    (it blocks for as long as a socket of the context is open)."""
    done = threading.Event()

    def term() -> None:
        ctx.term()
        done.set()

    threading.Thread(target=term, name="zmq-term-probe", daemon=True).start()
    return done.wait(deadline_s)
