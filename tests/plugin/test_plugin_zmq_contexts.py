"""A zmq context whose sockets were all closed but which was never terminated (issue 48, point
4): its eventfds and epoll instances are one ``fd-leak`` naming the line that created it, never
a context that is not certainly theirs. Both sides, with real pytest runs (``-p shutdown``), and
``no_os_leaks()`` in this process."""

from __future__ import annotations

import json

import pytest

zmq = pytest.importorskip("zmq", reason="the dev extra installs pyzmq")

from test_plugin_zmq import CONNECTED_PAIR  # noqa: E402

from pytest_shutdown import ShutdownContractError, no_os_leaks  # noqa: E402


def _findings(pytester: pytest.Pytester) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    report = json.loads((pytester.path / "r.json").read_text())
    return {t["nodeid"].split("::")[-1]: t["findings"] for t in report["tests"] if t["findings"]}


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-grace=0.5",
        "--shutdown-report=r.json", timeout=120,
    )  # fmt: skip


def _line_of(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.strip().splitlines(), 1) if text in line)


#: The inner suites' start: a context whose sockets (a connected pair, one message delivered)
#: are closed, and a way to keep it where no owner reaches (the test's own leak).
USED = (
    CONNECTED_PAIR
    + """
import asyncio
import ctypes

import pytest
import zmq.asyncio

def keep(obj):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))

def used(ctx):
    for sock in connected_pair(ctx):
        sock.close(linger=0)
    return ctx
"""
)

LEFT = (
    USED
    + """
def test_one_io_thread():
    keep(used(zmq.Context()))  # one io thread

def test_two_io_threads():
    keep(used(zmq.Context(io_threads=2)))  # two io threads

def test_no_socket():
    keep(zmq.Context())  # no socket

def test_an_asyncio_context_shadowing_a_sync_one():
    sync = zmq.Context(io_threads=2)  # shadowed
    ctx = zmq.asyncio.Context(sync)

    async def main():  # vLLM's MPClient: asyncio sockets on the shadow
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}")
        await push.send(b"x")
        assert await pull.recv() == b"x"
        for sock in (push, pull):
            sock.close(linger=0)

    asyncio.run(main())
    keep(ctx)

def test_two_contexts_one_terminated():
    kept = used(zmq.Context())  # kept of two
    used(zmq.Context(io_threads=2)).term()
    keep(kept)

def test_terminated():
    used(zmq.Context(io_threads=2)).term()

def test_with():
    with zmq.Context() as ctx:
        used(ctx)
"""
)


def test_a_context_never_terminated_is_one_fd_leak_naming_its_creation_site(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_left=LEFT)
    result = _run(pytester)
    result.assert_outcomes(passed=7, errors=5)
    found = _findings(pytester)
    site = str(pytester.path / "test_left.py")
    expected = {  # the test -> (its creation line, io threads, eventfds, epoll instances)
        "test_one_io_thread": ("# one io thread", 1, 3, 2),
        "test_two_io_threads": ("# two io threads", 2, 4, 3),
        "test_no_socket": ("# no socket", 1, 1, 0),
        "test_an_asyncio_context_shadowing_a_sync_one": ("# shadowed", 2, 4, 3),
        "test_two_contexts_one_terminated": ("# kept of two", 1, 3, 2),
    }
    assert set(found) == set(expected), found
    for test, (comment, threads, eventfds, polls) in expected.items():
        (finding,) = found[test]
        assert finding["code"] == "fd-leak"
        records = finding["details"]["fds"]
        assert sorted(r["kind"] for r in records) == ["eventfd"] * eventfds + ["eventpoll"] * polls
        where = f"{site}:{_line_of(LEFT, comment)}"
        facts = {r["fd"]: r["zmq_context"] for r in records}
        assert {f["created_at"] for f in facts.values()} == {where}, records
        assert {f["io_threads"] for f in facts.values()} == {threads}
        assert all(f["fds"] == sorted(facts) for f in facts.values())
        count = eventfds + polls
        named = f"zmq Context created at {where}, never terminated (its {count} descriptor"
        assert named in finding["message"], finding["message"]
        assert finding["message"].count("zmq Context created at") == 1  # one text for them all
        assert "likely held by libzmq" not in finding["message"]
        for record in records:
            assert "libzmq's mailbox or poller of zmq." in record["opened_by"], record
    message = found["test_two_io_threads"][0]["message"]
    assert "(its 7 descriptors: 4 eventfds, 3 epoll instances)" in message
    assert "(its 1 descriptor: 1 eventfd)" in found["test_no_socket"][0]["message"]


def test_two_contexts_left_at_once_are_not_told_apart(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_two=USED
        + """
def test_two_left():
    keep(used(zmq.Context()))
    keep(used(zmq.Context()))
"""
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    (finding,) = _findings(pytester)["test_two_left"]
    assert finding["code"] == "fd-leak"
    assert "zmq Context created at" not in finding["message"]
    assert "likely held by libzmq's native code" in finding["message"]
    assert not any("zmq_context" in r for r in finding["details"]["fds"])


def test_a_session_fixtures_context_that_a_test_starts_is_not_the_tests(
    pytester: pytest.Pytester,
) -> None:
    """The fixture made the context (its own mailbox); the test's first socket started its
    reaper and I/O threads, whose descriptors stay with the context until the fixture ends."""
    pytester.makepyfile(
        test_fixture=USED
        + """
@pytest.fixture(scope="session")
def ctx():
    ctx = zmq.Context(io_threads=2)
    yield ctx
    ctx.term()

def test_first_use(ctx):
    used(ctx)

def test_second_use(ctx):
    used(ctx)
"""
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    assert _findings(pytester) == {}


def test_no_os_leaks_names_a_context_the_block_left_unterminated() -> None:
    ctx = None
    try:
        with pytest.raises(ShutdownContractError) as caught:
            with no_os_leaks(grace=0.2, ports=False, shm=False):
                ctx = zmq.Context(io_threads=2)
                ctx.socket(zmq.PAIR).close(linger=0)
    finally:
        if ctx is not None:
            ctx.term()
    (finding,) = caught.value.findings
    assert f"zmq Context created at {__file__}:" in finding.message, finding.message
    assert ", never terminated (its 7 descriptors: 4 eventfds, 3 epoll instances)" in (
        finding.message
    )
