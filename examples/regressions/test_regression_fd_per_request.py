"""One file descriptor leaked per request (vLLM RFC #24885: a deleted engine must free its fds).

Each request gets its own response channel, a pipe; the handler closes the end it reads but not
the end the engine wrote to. Nothing fails at once: a long-running server runs out of
descriptors ("Too many open files") after ``ulimit -n`` requests. CPython's regression runner
counts exactly this (``-R``, PR #7409). Fixed by closing both ends.
"""

from __future__ import annotations

import os

import pytest

from pytest_shutdown import ShutdownContractError, no_os_leaks

REQUESTS = 5


class BuggyFrontend:
    def handle(self, prompt: bytes) -> bytes:
        read_end, write_end = os.pipe()
        os.write(write_end, prompt.upper())  # the "engine" answers on the request's channel
        answer = os.read(read_end, 1024)
        os.close(read_end)  # the write end is forgotten: one descriptor per request
        self.leaked = getattr(self, "leaked", []) + [write_end]
        return answer


class FixedFrontend:
    def handle(self, prompt: bytes) -> bytes:
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, prompt.upper())
            return os.read(read_end, 1024)
        finally:
            os.close(read_end)
            os.close(write_end)


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    fds = error.findings[0].details["fds"]
    assert len(fds) == REQUESTS and all(f["kind"] == "pipe" for f in fds)
    assert all("write end" in f["what"] for f in fds)
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="one fd per request")
def test_buggy_frontend_leaks_one_descriptor_per_request() -> None:
    frontend = BuggyFrontend()
    try:
        with no_os_leaks(grace=0):
            for i in range(REQUESTS):
                assert frontend.handle(b"hi %d" % i) == b"HI %d" % i
    except ShutdownContractError as error:
        expect("fd-leak", error)
    finally:
        for fd in getattr(frontend, "leaked", []):
            os.close(fd)


def test_fixed_frontend_closes_every_request_channel() -> None:
    frontend = FixedFrontend()
    with no_os_leaks(grace=0):
        for i in range(REQUESTS):
            assert frontend.handle(b"hi %d" % i) == b"HI %d" % i
