"""A child forked during a test inherits every socket the process holds: a wider-scope
fixture's listener is not the child's port, nor its test's. A port the child binds itself is."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

SUITE = """
import multiprocessing, socket, time
import pytest

ALLOW = pytest.mark.allow_leaks(processes=True, reason="only the ports are checked here")

@pytest.fixture(scope="module")
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()

def idle():
    time.sleep(1.5)

def serve():
    own = socket.socket()
    own.bind(("127.0.0.1", 0))
    own.listen()
    time.sleep(1.5)

def start(target):
    child = multiprocessing.get_context("fork").Process(target=target)
    child.start()
    return child

@ALLOW
def test_a_child_inherits_the_fixtures_listener(listener):
    start(idle)

@ALLOW
def test_a_child_binds_its_own_port(listener):
    child = start(serve)
    time.sleep(0.5)  # bound by now

def test_last():
    time.sleep(1.6)  # the children end before the session does
"""


def test_an_inherited_listener_is_no_port_leak_and_a_childs_own_port_is(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_ports=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.2", "-p", "no:randomly", "-v"
    )
    result.assert_outcomes(passed=3, errors=1)
    out = result.stdout.str()
    assert "ERROR at teardown of test_a_child_inherits_the_fixtures_listener" not in out
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_child_binds_its_own_port*",
            "shutdown guard: [[]port-leak] TCP socket listening on 127.0.0.1:* held by pid *",
        ]
    )
