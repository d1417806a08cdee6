"""The store's port is taken below the ephemeral range, where no outgoing connection is given
one (a parallel test's client took a port picked by bind(0) before the store bound it)."""

from __future__ import annotations

import socket

import pytest

from pytest_shutdown.engine import distributed


def test_the_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = distributed._ephemeral_low()
    for _ in range(20):
        port = distributed.free_port()
        assert distributed._FIXED_PORTS_FROM <= port < low
        with socket.socket() as sock:
            sock.bind((distributed.STORE_HOST, port))  # free: binds


def test_a_taken_port_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind((distributed.STORE_HOST, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(distributed, "_FIXED_PORTS_FROM", busy)
        monkeypatch.setattr(distributed, "_ephemeral_low", lambda: busy + 1)
        port = distributed.free_port()  # the only candidate is taken: the OS picks one
        assert port != busy and port > 0
