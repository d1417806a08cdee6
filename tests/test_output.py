"""What a user reads: failures point at their own line, the summary reads as a result, help text
flows as paragraphs."""

from __future__ import annotations

import textwrap

import pytest
from inner_runs import RAISES_WHEN_REPEATED

FAILING_HELPERS = (
    """
import threading
import weakref

from pytest_shutdown import (
    Finding,
    assert_finalizers_ok,
    assert_idempotent_shutdown,
    assert_not_force_killed,
    no_leaks,
)
from pytest_shutdown.findings.finding import raise_if_any


class Outcome:
    force_killed = ["EngineCore_0"]
    timeout = 0.1
    exitcodes = {"EngineCore_0": -9}
    duration_s = 0.2


class BoundFinalizer:
    def __init__(self):
        self._finalizer = weakref.finalize(self, self.shutdown)

    def shutdown(self):
        pass

"""
    + RAISES_WHEN_REPEATED
    + """

def test_force_killed():
    assert_not_force_killed(Outcome())  # USER LINE force


def test_finalizers():
    obj = BoundFinalizer()
    try:
        assert_finalizers_ok(obj)  # USER LINE finalizers
    finally:
        obj._finalizer.detach()


def test_idempotent():
    assert_idempotent_shutdown(RaisesWhenRepeated(), calls=2)  # USER LINE idempotent


def test_raise_if_any():
    raise_if_any([Finding("force-killed", "made up")])  # USER LINE raise


def test_no_leaks():
    stop = threading.Event()
    try:
        with no_leaks(grace=0.1):  # USER LINE no_leaks
            threading.Thread(target=stop.wait, args=(10,), daemon=True).start()
    finally:
        stop.set()
"""
)


def test_a_helper_failure_shows_the_callers_line_not_the_helpers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_helpers=FAILING_HELPERS)

    result = pytester.runpytest("-p", "no:randomly", "--tb=long")

    result.assert_outcomes(failed=5)
    out = result.stdout.str()
    for tag in ("force", "finalizers", "idempotent", "raise", "no_leaks"):
        assert f"# USER LINE {tag}" in out, tag
    # no frame of the helpers themselves is shown
    assert "pytest_shutdown/helpers/" not in out
    assert "pytest_shutdown/findings/finding.py" not in out
    assert "contextlib.py" not in out
    # the assert-style helper shows the finding's whole message, untruncated
    result.stdout.fnmatch_lines(
        ["*[[]finalizer-bound-method[]]*keeps the object alive so the finalizer never runs."]
    )


LEAKY = """
import threading

stop = threading.Event()


def test_leaks_a_thread():
    # never ends by itself (a daemon: the exit does not wait for it): warn mode confirms it once
    # its 0.2 s grace ran out, however busy the machine is
    threading.Thread(target=stop.wait, name="leaky", daemon=True).start()


def test_zz_after():
    pass
"""


def test_the_leak_warning_points_at_the_test(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(test_leaky=LEAKY)
    lines = path.read_text().splitlines()
    line = lines.index("def test_leaks_a_thread():") + 1

    result = pytester.runpytest(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-guard=warn", "--shutdown-grace=0.2"
    )

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"*test_leaky.py:{line}: ShutdownLeakWarning: [[]thread-leak]*"])
    assert "plugin/guard" not in result.stdout.str()


def test_the_summary_reads_as_a_result_first(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")

    result = pytester.runpytest("-p", "shutdown", "--shutdown-grace=0.3", "--shutdown-budget=9")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["no findings in 1 test (guard in fail mode, grace 0.3 s, budget 9 s)"]
    )


def test_after_a_collection_error_the_summary_says_nothing_was_checked(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_broken="import no_such_module_here\n")

    result = pytester.runpytest("-p", "shutdown")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["the guard checked nothing: 1 collection error (guard in fail mode, grace 2 s)"]
    )
    assert "no findings" not in result.stdout.str()


def test_with_xdist_a_collection_error_is_named_beside_the_tests_that_ran(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_broken="import no_such_module_here\n", test_fine="def test_ok(): pass\n"
    )

    result = pytester.runpytest_subprocess("-p", "shutdown", "-n", "2", "-p", "no:randomly")

    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["no findings in 1 test; not checked: 1 collection error (guard in fail mode, grace 2 s)"]
    )


def test_help_describes_each_option_in_one_flowing_paragraph(
    pytestconfig: pytest.Config, pytester: pytest.Pytester
) -> None:
    parser = pytestconfig._parser  # noqa: SLF001 - where the options are listed
    options = parser.getgroup("shutdown").options
    assert options
    for option in options:
        assert "\n" not in str(option.attrs()["help"]), option.names()
    for name, (help_text, *_rest) in parser._inidict.items():  # noqa: SLF001
        if name.startswith("shutdown_"):
            assert "\n" not in help_text, name

    result = pytester.runpytest("-p", "shutdown", "--help")

    # before, the source's line breaks cut this sentence after "or a"
    flowed = " ".join(result.stdout.str().split())
    assert "leaves threads, child processes or a gc.freeze() behind" in flowed
    lines = result.stdout.lines
    (start,) = [i for i, line in enumerate(lines) if line.startswith("  --shutdown-guard=")]
    guard_help = lines[start + 1 : start + 4]
    width = max(len(line) for line in guard_help)
    # a paragraph wraps at the terminal width: no line of it stops halfway
    assert all(len(line) > width - 20 for line in guard_help), textwrap.indent(
        "\n".join(guard_help), "  "
    )
