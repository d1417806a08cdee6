"""``@pytest.mark.shutdown_cycles(n)``: the call phase repeated in one process under the growth
check, guard on or off, under xdist; bad arguments are collection errors; the engine fixtures'
cycle count."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from pytest_shutdown.plugin.cycles import MAX_CYCLES, cycles_of

CYCLES = textwrap.dedent(
    """
    import pytest

    KEPT = []

    class Engine:
        pass

    @pytest.fixture
    def engine_log():
        with open("log.txt", "a") as log:
            log.write("s")  # one setup per run of the test
        return "log.txt"

    @pytest.mark.shutdown_cycles(3)
    def test_clean(engine_log):
        with open(engine_log, "a") as log:
            log.write("c")
        Engine()

    @pytest.mark.shutdown_cycles(4, warmup=1)
    def test_keeps_every_engine():
        KEPT.append(Engine())
    """
)

EXPECTED = [
    "*[[]growth[]] Engine: +1 per cycle (4 cycles); held by list test_cycles.KEPT*",
    "FAILED [[]growth[]] test_cycles.py::test_keeps_every_engine*",
]


@pytest.fixture
def cycles_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_cycles=CYCLES)
    return pytester


def test_the_marker_repeats_the_call_with_fixtures_set_up_once(
    cycles_suite: pytest.Pytester,
) -> None:
    result = cycles_suite.runpytest_subprocess("-p", "no:randomly", "-rf")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(EXPECTED)
    # warm-up 2 + 3 measured calls, one fixture setup (CPython -R's way)
    assert (cycles_suite.path / "log.txt").read_text() == "s" + "c" * 5


def test_the_marker_works_under_the_guard(cycles_suite: pytest.Pytester) -> None:
    result = cycles_suite.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "-rf", "--shutdown-report=r.json"
    )

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*= shutdown =*", "1 of 2 tests with findings (growth: 1)*", *EXPECTED]
    )
    assert (cycles_suite.path / "log.txt").read_text() == "s" + "c" * 5
    assert '"code": "growth"' in (cycles_suite.path / "r.json").read_text()


def test_the_marker_works_under_xdist(cycles_suite: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result = cycles_suite.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "-n", "2", "-rf"
    )

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*1 of 2 tests with findings (growth: 1)*", *EXPECTED])
    assert (cycles_suite.path / "log.txt").read_text() == "s" + "c" * 5


def test_the_marker_is_registered_without_the_guard(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.shutdown_cycles(n, warmup=2): *"])


@pytest.mark.parametrize(
    ("args", "said", "guard"),
    [
        ("0", "takes one integer n from 1 to 100000, got 0", []),
        ("0", "takes one integer n from 1 to 100000, got 0", ["-p", "shutdown"]),
        ("'3'", "takes one integer n from 1 to 100000, got '3'", []),
        ("True", "takes one integer n from 1 to 100000, got True", []),
        ("", "takes one integer n from 1 to 100000, got ()", []),
        ("2, 3", "takes one integer n from 1 to 100000, got (2, 3)", []),
        ("10**12", "takes one integer n from 1 to 100000, got 1000000000000", []),
        ("100001", "takes one integer n from 1 to 100000, got 100001", ["-p", "shutdown"]),
        ("cycles=100001", "takes one integer n from 1 to 100000, got 100001", []),
        ("2, warmup=-1", "warmup= takes an integer from 0 to 100000, got -1", ["-p", "shutdown"]),
        ("2, warmup=10**12", "warmup= takes an integer from 0 to 100000, got 1000000000000", []),
        ("2, speed=1", "unknown argument(s) speed; accepted: n", []),
    ],
)
def test_bad_marker_arguments_are_collection_errors(
    pytester: pytest.Pytester, args: str, said: str, guard: list[str]
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.shutdown_cycles({args})
        def test_it():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*guard)

    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*test_bad.py::test_it: @pytest.mark.shutdown_cycles*{said}*"])
    assert "1 error" in result.stdout.str()


def _marked(mark: pytest.MarkDecorator) -> pytest.Item:
    item = SimpleNamespace(nodeid="t.py::test_it", get_closest_marker=lambda name: mark.mark)
    return item  # type: ignore[return-value]


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.shutdown_cycles(MAX_CYCLES, warmup=MAX_CYCLES),
        pytest.mark.shutdown_cycles(cycles=MAX_CYCLES, warmup=0),
        pytest.mark.shutdown_cycles(1),
    ],
)
def test_the_bounds_themselves_are_accepted(mark: pytest.MarkDecorator) -> None:
    n = mark.kwargs.get("cycles", mark.args[0] if mark.args else None)
    assert cycles_of(_marked(mark)) == (n, mark.kwargs.get("warmup", 2))


@pytest.mark.parametrize(
    ("mark", "said"),
    [
        (pytest.mark.shutdown_cycles(MAX_CYCLES + 1), f"n from 1 to {MAX_CYCLES}, got 100001"),
        (pytest.mark.shutdown_cycles(10**12), "got 1000000000000"),
        (pytest.mark.shutdown_cycles(2, warmup=MAX_CYCLES + 1), f"from 0 to {MAX_CYCLES}, got"),
    ],
)
def test_past_the_bounds_is_a_usage_error(mark: pytest.MarkDecorator, said: str) -> None:
    with pytest.raises(pytest.UsageError, match="shutdown_cycles") as raised:
        cycles_of(_marked(mark))
    assert said in str(raised.value)


ENGINE_FIXTURE = textwrap.dedent(
    """
    import pytest

    pytest.importorskip("torch")

    @pytest.mark.parametrize("reference_renderer", [3], indirect=True)
    def test_cycled_renderer(reference_renderer):
        assert reference_renderer.tokenize("hi").result(10)

    @pytest.mark.parametrize("reference_renderer", ["many"], indirect=True)
    def test_bad_count(reference_renderer):
        pass
    """
)


def test_an_engine_fixture_takes_a_cycle_count(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch", reason="the reference engine needs torch")
    pytester.makepyfile(test_fixture_cycles=ENGINE_FIXTURE)

    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", "-rE")

    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*fixture 'reference_renderer': its parameter is a cycle count*got 'many'*"]
    )
