"""An error at a fixture's set-up or teardown shows the user's frames and the finding, never a
frame of the plugin's hooks (``--fulltrace`` still shows them, as pytest does for its own)."""

from __future__ import annotations

import re

import pytest
from inner_runs import ARGS, RAISES_WHEN_REPEATED

#: Fixtures in a conftest.py: pytest cuts a traceback at the test's own file, so only a fixture
#: defined elsewhere shows the hook frames between pytest's and the fixture's.
CONFTEST = (
    """
import threading
import pytest
from pytest_shutdown import assert_idempotent_shutdown

_release = threading.Event()
"""
    + RAISES_WHEN_REPEATED
    + """

@pytest.fixture
def broken():
    yield
    assert 1 == 2, "broken teardown"


@pytest.fixture(scope="module")
def broken_module():
    yield
    assert 1 == 3, "broken module teardown"


@pytest.fixture(scope="module")
def broken_module_setup():
    assert 1 == 4, "broken module set-up"
    yield


@pytest.fixture
def leaky():
    yield
    threading.Thread(target=_release.wait, name="left-by-fixture", daemon=True).start()


@pytest.fixture
def checked():
    yield
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)


def check_in_call():
    assert_idempotent_shutdown(RaisesWhenRepeated(), threads=0)
"""
)

TESTS = """
from conftest import check_in_call


def test_broken(broken):
    pass


def test_leaky(leaky):
    pass


def test_checked(checked):
    pass


def test_call():
    check_in_call()
"""

#: In a file of its own: its module-scope fixture is torn down when that file ends.
MODULE_TESTS = """
def test_broken_module(broken_module):
    pass
"""

SETUP_TESTS = """
def test_broken_module_setup(broken_module_setup):
    pass
"""


def _line(needle: str, last: bool = False) -> int:
    """The first (or last) line of the conftest.py pytester writes that holds ``needle``."""
    numbers = [n for n, line in enumerate(CONFTEST.strip().splitlines(), 1) if needle in line]
    return numbers[-1] if last else numbers[0]


_TITLE = re.compile(r"^_+ (.+?) _+$")


def _blocks(output: str) -> dict[str, list[str]]:
    """The lines of each ``ERROR at ...`` / test failure block, by its title."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        title = _TITLE.match(line)
        if title is not None:
            current = blocks.setdefault(title.group(1), [])
        elif line.startswith("=") and current is not None:
            current = None  # a section of the summary ends the last block
        elif current is not None:
            current.append(line)
    return blocks


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a=TESTS, test_b_module=MODULE_TESTS, test_c_module_setup=SETUP_TESTS)
    return pytester


def _run(suite: pytest.Pytester, *args: str) -> dict[str, list[str]]:
    result = suite.runpytest_subprocess(*ARGS, *args)
    result.assert_outcomes(passed=4, failed=1, errors=5)
    return _blocks(result.stdout.str())


@pytest.mark.parametrize("options", [(), ("--shutdown-budget=30", "--shutdown-quiet")])
def test_no_plugin_frame_in_a_fixture_error(suite: pytest.Pytester, options: tuple[str]) -> None:
    blocks = _run(suite, *options)
    checked_line = _line("assert_idempotent_shutdown(RaisesWhenRepeated")
    call_line = _line("assert_idempotent_shutdown(RaisesWhenRepeated", last=True)
    expected = {
        "ERROR at teardown of test_broken": ("broken teardown", "AssertionError"),
        "ERROR at teardown of test_broken_module": ("broken module teardown", "AssertionError"),
        "ERROR at setup of test_broken_module_setup": ("broken module set-up", "AssertionError"),
        "ERROR at teardown of test_checked": (
            f"conftest.py:{checked_line}: ShutdownContractError",
            "[shutdown-raised] RaisesWhenRepeated",
        ),
        "test_call": (f"conftest.py:{call_line}: ShutdownContractError", "[shutdown-raised]"),
        "ERROR at teardown of test_leaky": (
            "[thread-leak] 1 thread started in test_leaky",
            f'conftest.py", line {_line("left-by-fixture")}, in leaky',
        ),
    }
    for title in list(expected)[:3]:  # the assertion's own line, as pytest prints it
        message, error = expected[title]
        expected[title] = (message, f"conftest.py:{_line(message)}: {error}")
    assert set(blocks) == set(expected), list(blocks)
    for title, needles in expected.items():
        text = "\n".join(blocks[title])
        for needle in needles:
            assert needle in text, f"{title}: {needle!r} not in\n{text}"
        assert "pytest_shutdown/" not in text, f"{title}: a plugin frame in\n{text}"


def test_a_fixture_error_is_as_long_as_without_the_plugin(suite: pytest.Pytester) -> None:
    """An assertion in a fixture prints what plain pytest prints for it."""
    guarded = _run(suite)
    result = suite.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1, errors=4)  # the leak is no error without it
    plain = _blocks(result.stdout.str())
    for title in (
        "ERROR at teardown of test_broken",
        "ERROR at teardown of test_broken_module",
        "ERROR at setup of test_broken_module_setup",
        "ERROR at teardown of test_checked",
        "test_call",
    ):
        assert len(guarded[title]) == len(plain[title]), (guarded[title], plain[title])


def test_fulltrace_shows_the_plugin_frames(suite: pytest.Pytester) -> None:
    blocks = _run(suite, "--fulltrace")
    teardown = "\n".join(blocks["ERROR at teardown of test_broken"])
    assert "pytest_shutdown/plugin/guard/__init__.py" in teardown
