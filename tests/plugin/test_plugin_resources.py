"""The resource model: the guard walks the registered kinds; --shutdown-resources chooses them;
allow_leaks takes each kind's keyword."""

from __future__ import annotations

import textwrap

import pytest

from pytest_shutdown import resources
from pytest_shutdown.resources.base import ResourceKind


def test_every_registered_kind_follows_the_protocol() -> None:
    kinds = resources.default_kinds()
    assert [k.name for k in kinds] == list(resources.KINDS)
    for kind in kinds:
        assert isinstance(kind, ResourceKind), kind.name
        assert kind.allow_key == resources.KINDS[kind.name][0]
        before = kind.snapshot()
        assert list(kind.new_since(before)) == []  # nothing happened in between


@pytest.mark.long_running(10)
def test_resources_option_runs_only_the_chosen_kinds(leaky_suite: pytest.Pytester) -> None:
    result = leaky_suite.runpytest_subprocess("-p", "shutdown", "--shutdown-resources=threads")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["ERROR test_leaky.py::test_thread_leak - shutdown guard*"])
    ini = leaky_suite.runpytest_subprocess(
        "-p", "shutdown", "-o", "shutdown_resources=processes, gc-freeze"
    )
    ini.assert_outcomes(passed=4, errors=2)
    everything = leaky_suite.runpytest_subprocess("-p", "shutdown", "--shutdown-resources=all")
    everything.assert_outcomes(passed=4, errors=3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("threads,sockets", "--shutdown-resources: unknown resource kind(s) 'sockets'; accepted:*"),
        ("", "--shutdown-resources: '' is not accepted; accepted: a comma-separated list of*"),
        ("all,threads", "--shutdown-resources: 'all' cannot be combined with kind names"),
    ],
)
def test_a_bad_resources_value_is_a_usage_error(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "shutdown", f"--shutdown-resources={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_a_bad_ini_resources_value_names_the_ini_key(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nshutdown_resources = threads, nope\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "shutdown")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*shutdown_resources (ini): unknown resource kind(s) 'nope'*"])


def test_a_new_kind_is_a_module_and_a_registry_line(pytester: pytest.Pytester) -> None:
    """A kind added to the registry is walked by the guard, named by --shutdown-resources and
    silenced by its own allow_leaks keyword, with no change to the guard."""
    pytester.makepyfile(
        marker_kind=textwrap.dedent(
            """
            from pytest_shutdown.findings.finding import Finding
            from pytest_shutdown.resources.base import ObjectKind

            OPEN = set()  # what the code under test "opened"

            class MarkerKind(ObjectKind):
                name = "markers"
                allow_key = "markers"

                def snapshot(self):
                    return frozenset(OPEN)

                def new_since(self, before, allow=None):
                    return () if allow is True else tuple(sorted(OPEN - before))

                def settle(self, items, deadline):
                    return tuple(i for i in items if i in OPEN)

                def findings(self, items, subject, *, grace, extra=None):
                    return [Finding("process-leak", f"{subject} left {list(items)}", {})]

                def restore(self, items):
                    OPEN.difference_update(items)
            """
        )
    )
    pytester.makeconftest(
        """
        from pytest_shutdown import resources
        resources.KINDS["markers"] = ("markers", "marker_kind:MarkerKind")
        """
    )
    pytester.makepyfile(
        test_kind=textwrap.dedent(
            """
            import pytest
            from marker_kind import OPEN

            def test_leaves_one():
                OPEN.add("a")

            def test_after_restore():
                assert OPEN == set()

            @pytest.mark.allow_leaks(markers=True, reason="on purpose")
            def test_allowed():
                OPEN.add("b")

            def test_cleans_up():
                OPEN.add("c")
                OPEN.discard("c")
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-grace=0.1")
    result.assert_outcomes(passed=4, errors=1)
    assert "[process-leak] test_leaves_one left ['a']" in result.stdout.str()
    chosen = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-resources=threads")
    chosen.assert_outcomes(passed=3, failed=1)  # not walked: nothing restored either
