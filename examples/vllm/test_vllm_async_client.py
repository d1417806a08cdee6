"""The async helpers on vLLM's own async client, one line per check (``make vllm-check``).

``AsyncMPClient`` is what ``AsyncLLM`` talks to its EngineCore through: ZMQ sockets on an asyncio
context, an output queue task, and ``BackgroundResources``, the finalizer that closes the sockets
(linger 0) and cancels the task, on the task's loop or from another thread. Each check builds the
client with vLLM's own ``__init__`` against a real EngineCore process (``ConnectedEngineCore``:
vLLM's handshake, socket threads and busy loop, no model) and answers one utility call over ZMQ
before it shuts down.

Not run here: ``AsyncLLM`` itself. Its ``__init__`` builds a renderer and an input processor
from a real ``ModelConfig`` (the model's Hugging Face config and tokenizer files); what it adds
to shutdown (``renderer.shutdown()`` and cancelling its own output handler after
``engine_core.shutdown()``) is not reached without a model. The renderer's shutdown is checked in
``test_vllm_shutdown.py``.

Two checks are strict ``xfail``: gaps vLLM 0.33.0 has (their reasons say which). They fail the
run once vLLM closes them, so that they become ordinary checks.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from typing import Any

import pytest

_VLLM = importlib.util.find_spec("vllm")
if _VLLM is None or _VLLM.origin in (None, "namespace"):  # this folder is not vLLM
    pytest.skip(
        "vllm is not installed here: `make vllm-check` runs these tests in a side venv",
        allow_module_level=True,
    )

from client_probes import (  # noqa: E402 - after the skip: they import vllm
    open_sockets,
    shut_down_client,
    started_client,
    term_within,
)
from model_free import serve_until_killed  # noqa: E402
from vllm.v1.engine.exceptions import EngineDeadError  # noqa: E402

from pytest_shutdown import (  # noqa: E402
    ShutdownContractError,
    assert_idempotent_shutdown,
    kill_tree_at,
    no_leaks,
    no_os_leaks,
    no_task_leaks,
)

#: How long the output queue task may take to end once shutdown cancelled it.
TASK_GRACE_S = 2.0
#: How long ``zmq.Context.term()`` may take once every socket is closed (it returns at once).
TERM_DEADLINE_S = 5.0
#: How long the threads, processes and descriptors of a client may take to go after shutdown.
LEAK_GRACE_S = 5.0
#: How long the EngineCore has to die once its client was SIGKILLed.
ORPHAN_DEADLINE_S = 5.0

CLIENT = "vllm.v1.engine.core_client"


def assert_context_terminable(client: Any) -> None:
    """Every socket of the client is closed and its context's ``term()`` returns in time."""
    assert not open_sockets(client), f"open after shutdown: {open_sockets(client)}"
    assert term_within(client.resources.ctx, TERM_DEADLINE_S), (
        f"zmq.Context.term() still blocked after {TERM_DEADLINE_S} s"
    )


# -- MPClient.shutdown and BackgroundResources ----------------------------------------------------


@pytest.mark.exercises(f"{CLIENT}.MPClient.shutdown (AsyncMPClient, on its loop)")
def test_async_client_shutdown_is_idempotent() -> None:
    async def life() -> None:
        async with no_task_leaks(grace=TASK_GRACE_S):
            client = await started_client()
            assert_idempotent_shutdown(client)

    asyncio.run(life())


@pytest.mark.exercises(f"{CLIENT}.BackgroundResources (shutdown from other threads)")
def test_async_client_shutdown_from_other_threads_is_idempotent() -> None:
    async def life() -> None:
        async with no_task_leaks(grace=TASK_GRACE_S):
            client = await started_client()
            # the calls reach the loop through call_soon_threadsafe; it stays free to run them
            await asyncio.to_thread(assert_idempotent_shutdown, client, calls=3, threads=4)

    asyncio.run(life())


@pytest.mark.exercises(f"{CLIENT}.AsyncMPClient._ensure_output_queue_task")
def test_async_client_output_task_ends_with_engine_dead() -> None:
    async def life() -> None:
        client = await started_client()
        task = client.resources.output_queue_task
        client.shutdown()
        await asyncio.wait_for(asyncio.shield(task), TASK_GRACE_S)
        assert client.resources.output_socket.closed
        with pytest.raises(EngineDeadError):  # what the cancelled task left to its readers
            await client.get_output_async()

    asyncio.run(life())


@pytest.mark.exercises("vllm.utils.network_utils.close_sockets (linger 0)")
def test_async_client_leaves_its_context_terminable() -> None:
    assert_context_terminable(asyncio.run(shut_down_client()))


@pytest.mark.allow_leaks(
    asyncio=True,
    reason="the scenario: the client's loop ends before its shutdown, so asyncio.run cancels "
    "the output queue task the client left pending (the guard's task-leak)",
)
@pytest.mark.exercises(f"{CLIENT}.BackgroundResources (its loop already closed)")
def test_async_client_shutdown_after_its_loop_closed() -> None:
    client = asyncio.run(started_client())
    assert_idempotent_shutdown(client)
    assert_context_terminable(client)


@pytest.mark.exercises(f"{CLIENT}.MPClient (shut down, then collected)")
def test_async_client_leaves_nothing_once_collected() -> None:
    with no_leaks(grace=LEAK_GRACE_S), no_os_leaks(grace=LEAK_GRACE_S):
        asyncio.run(shut_down_client())
        gc.collect()


@pytest.mark.xfail(
    strict=True,
    raises=ShutdownContractError,
    reason="vLLM 0.33.0: MPClient.shutdown closes its sockets but never terminates its zmq "
    "context; the context's io-thread descriptors (eventfd, epoll) stay open until the client "
    "is garbage collected (zmq.Context.__del__ then destroys it, with a ResourceWarning)",
)
@pytest.mark.exercises(f"{CLIENT}.MPClient.shutdown (its zmq context)")
def test_async_client_shutdown_releases_its_context() -> None:
    client = None
    try:
        with no_os_leaks(grace=LEAK_GRACE_S, ports=False, shm=False):
            client = asyncio.run(shut_down_client())
    finally:
        if client is not None:  # what vLLM leaves to the garbage collector
            client.resources.ctx.term()


# -- the EngineCore of a killed front end ---------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="vLLM 0.33.0: an EngineCore does not watch its front end; once the process holding "
    "the AsyncMPClient is SIGKILLed, the EngineCore waits on its input socket forever "
    "(orphan-process) and the client's IPC socket files stay in the RPC folder (port-leak)",
)
@pytest.mark.exercises("vllm.v1.engine.core.EngineCoreProc (its client SIGKILLed)")
def test_a_sigkilled_async_client_leaves_no_engine_core() -> None:
    record = kill_tree_at(
        serve_until_killed, signal="SIGKILL", phase="ready", deadline_s=ORPHAN_DEADLINE_S
    )
    assert record.died, [finding.message for finding in record.findings]
