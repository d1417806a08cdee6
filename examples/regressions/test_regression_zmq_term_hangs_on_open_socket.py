"""vLLM PR #13298: ``zmq.Context.term()`` hangs at shutdown because a socket was not closed with
linger 0.

The front end's shutdown closed its sockets with their default linger (forever) and terminated
the context. ``term()`` blocks until every socket of the context is closed *and* has delivered
what it still queues: with the engine process gone, the last message queued for it can never be
delivered, and the shutdown hangs for good. Fixed by closing every socket with ``linger=0``
before ``term()`` (vLLM: ``ctx.destroy(linger=0)``).

The shape below is the front end's: a PUSH socket to an engine that is gone, the shutdown
message queued on it. The buggy shutdown runs in a daemon thread here, so that the example
itself ends; ``no_os_leaks`` probes the ``term()`` and reports ``zmq-term-blocked`` naming the
socket (type, endpoint, the line that created it).
"""

from __future__ import annotations

import socket
import threading

import pytest
import zmq

from pytest_shutdown import ShutdownContractError, no_os_leaks


def _endpoint() -> str:
    """A TCP endpoint nobody listens on: the engine that was there is gone."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


class BuggyClient:
    """Sends to its engine over ZMQ; ``shutdown()`` closes with the default linger."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.connect(endpoint)

    def shutdown(self) -> None:
        self.input_socket.send(b"SHUTDOWN", zmq.NOBLOCK)  # queued: the engine is gone
        self.input_socket.close()
        self.ctx.term()


class FixedClient(BuggyClient):
    def shutdown(self) -> None:
        self.input_socket.send(b"SHUTDOWN", zmq.NOBLOCK)
        self.input_socket.close(linger=0)  # the fix: drop what can never be delivered
        self.ctx.term()


def _deliver_the_queued_message(endpoint: str) -> None:
    """Take the message the buggy client still queues: its hung ``term()`` returns."""
    ctx = zmq.Context()
    engine = ctx.socket(zmq.PULL)
    try:
        engine.bind(endpoint)
        assert engine.poll(5000), "the queued message never arrived"
        engine.recv()
    finally:
        engine.close(linger=0)
        ctx.term()


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="term() hangs")
def test_buggy_client_hangs_in_term_at_shutdown() -> None:
    endpoint = _endpoint()
    shutdown = None
    try:
        with no_os_leaks(grace=0.5):
            client = BuggyClient(endpoint)
            shutdown = threading.Thread(target=client.shutdown, daemon=True)
            shutdown.start()
            shutdown.join(1.0)
            assert shutdown.is_alive()  # the bug: term() does not return
            _deliver_the_queued_message(endpoint)
            shutdown.join(5.0)
    except ShutdownContractError as error:
        assert error.codes == ["zmq-term-blocked"], error.codes
        (sock,) = error.findings[0].details["sockets"]
        assert (sock["type"], sock["endpoints"]) == ("PUSH", [endpoint])
        raise
    finally:
        if shutdown is not None and shutdown.is_alive():
            _deliver_the_queued_message(endpoint)


def test_fixed_client_terminates_its_context_at_shutdown() -> None:
    with no_os_leaks(grace=0.5):
        FixedClient(_endpoint()).shutdown()
