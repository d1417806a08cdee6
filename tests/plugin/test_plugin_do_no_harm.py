"""Do no harm: a fixture that stops its own process is not accused; fail mode kills only what
is certainly the test's (issue 44, items 3 and 4).

Each shape runs three times in real pytest processes: plain (``-p no:shutdown``), warn and
fail. Warn gives plain's outcome on every test; fail adds errors only on tests that leak.
"""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process checks read /proc (Linux)"
)


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """test id -> PASSED/FAILED/ERROR (an error at teardown after a pass counts as ERROR)."""
    found: dict[str, str] = {}
    for line in result.outlines:
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "::" in rest:
            nodeid = rest.split(" - ")[0].strip()
            if found.get(nodeid) != "ERROR":
                found[nodeid] = word
    return found


def run_modes(pytester: pytest.Pytester, *args: str) -> dict[str, dict[str, str]]:
    common = ("-p", "no:randomly", "-p", "no:cacheprovider", "-rA", *args)
    return {
        "plain": outcomes(pytester.runpytest_subprocess("-p", "no:shutdown", *common)),
        "warn": outcomes(
            pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn", *common)
        ),
        "fail": outcomes(
            pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=fail", *common)
        ),
    }


# --- a fixture that stops its own process is never accused -----------------------------------

STOPS_ITS_OWN = """
import subprocess, sys, pytest

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

@pytest.fixture(scope="{scope}")
def server():
    proc = subprocess.Popen(SLEEP)
    yield proc
    proc.{stop}()
    proc.wait(10)

class TestServer:
    def test_one(self, server):
        assert server.poll() is None

    def test_two(self, server):
        assert server.poll() is None

def test_after():
    pass
"""


@pytest.mark.parametrize("stop", ["terminate", "kill"])
@pytest.mark.parametrize("scope", ["function", "class", "module", "session"])
def test_a_fixture_that_stops_its_own_process_is_not_accused(
    pytester: pytest.Pytester, scope: str, stop: str
) -> None:
    pytester.makepyfile(test_server=STOPS_ITS_OWN.format(scope=scope, stop=stop))
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    assert "collateral-kill" not in result.stdout.str()
    result.assert_outcomes(passed=3)


BLANKET_KILL = """
import os, signal, subprocess, sys, time
import psutil, pytest

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(SLEEP)
    yield proc
    proc.terminate()
    proc.wait(10)

def test_uses(server):
    assert server.poll() is None

def test_kills_every_child(server):
    # SGLang's Engine.shutdown(): kill_process_tree(os.getpid(), include_parent=False)
    victims = psutil.Process(os.getpid()).children(recursive=True)
    for child in victims:
        child.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.poll() is None:
        time.sleep(0.01)
"""


def test_a_blanket_kill_of_a_fixtures_process_is_still_collateral(
    pytester: pytest.Pytester,
) -> None:
    """The other side: the module fixture's own teardown is not accused, a test's blanket kill
    of its process is."""
    pytester.makepyfile(test_blanket=BLANKET_KILL)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", "-rA")
    result.stdout.fnmatch_lines(
        ["*test_kills_every_child: ?collateral-kill? 1 process*by SIGKILL*"]
    )
    result.assert_outcomes(passed=2, errors=1)
