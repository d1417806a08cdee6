"""SGLang #15165 / #31645: the server's port stays bound after shutdown.

``shutdown()`` stopped the serving loop but nobody closed the listening socket: the port stayed
bound (for over an hour in the report, until the process exited), and the next launch on the
same port failed with "address already in use". The shape below is the standard library's:
``socketserver``'s ``shutdown()`` stops ``serve_forever`` but only ``server_close()`` releases
the port. Fixed by closing the socket in the server's own shutdown.
"""

from __future__ import annotations

import socketserver
import threading

import pytest

from pytest_shutdown import ShutdownContractError, no_os_leaks


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"ok")


class BuggyServer:
    """Serves in a thread; ``shutdown()`` stops serving and leaves the socket open."""

    def __init__(self) -> None:
        self._server = socketserver.TCPServer(("127.0.0.1", 0), _Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._thread.join(5)


class FixedServer(BuggyServer):
    def shutdown(self) -> None:
        super().shutdown()
        self._server.server_close()  # the fix: release the port


def expect(code: str, error: ShutdownContractError, port: int) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    assert [p["port"] for p in error.findings[0].details["ports"]] == [port]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="the port stays bound")
def test_buggy_server_keeps_its_port_after_shutdown() -> None:
    server = None
    try:
        with no_os_leaks(grace=0.5):
            server = BuggyServer()
            server.shutdown()
    except ShutdownContractError as error:
        assert server is not None
        expect("port-leak", error, server.port)
    finally:
        if server is not None:
            server._server.server_close()


def test_fixed_server_releases_its_port_at_shutdown() -> None:
    with no_os_leaks():
        server = FixedServer()
        server.shutdown()
