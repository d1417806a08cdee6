"""``--shutdown-quiet``: an ERROR record or a traceback written during a test's teardown (the
graceful shutdown of its fixtures) is a ``shutdown-logged-error`` finding of the test, through the
guard's findings path (fail and warn modes, the JSON report); a teardown that logs warnings, or
the option off, gives nothing, and off installs nothing.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SUITE = """
import logging, subprocess, sys, traceback
import pytest

log = logging.getLogger("engine.async_llm")
ORIGINAL = logging.Logger.callHandlers


class EngineDeadError(Exception):
    pass


@pytest.fixture
def noisy_engine():
    yield "engine"
    try:  # the graceful stop wakes the output handler, which takes it for a death
        raise EngineDeadError("EngineCore encountered an issue.")
    except EngineDeadError:
        log.exception("AsyncLLM output_handler failed.")


@pytest.fixture
def printing_engine():
    yield "engine"
    try:
        raise RuntimeError("socket closed from the wrong loop")
    except RuntimeError:
        traceback.print_exc()


CHILD = (
    "import traceback\\n"
    "try:\\n    raise ConnectionError('EngineCore_DP0 lost its socket')\\n"
    "except ConnectionError:\\n    traceback.print_exc()\\n"
)


@pytest.fixture
def engine_with_a_child():
    yield "engine"
    subprocess.run([sys.executable, "-c", CHILD], timeout=60, check=True)


@pytest.fixture
def warning_engine():
    yield "engine"
    log.warning("2 requests aborted by the shutdown")
    # the watch is installed for a teardown when the option is on, and only then
    assert (logging.Logger.callHandlers is not ORIGINAL) == {on!r}


def test_logged(noisy_engine):
    pass


def test_printed(printing_engine):
    pass


def test_child(engine_with_a_child):
    pass


def test_warning(warning_engine):
    assert logging.Logger.callHandlers is ORIGINAL  # never outside a teardown
"""


def _suite(pytester: pytest.Pytester, *, on: bool) -> None:
    pytester.makepyfile(test_suite=SUITE.format(on=on))


def _site(pytester: pytest.Pytester, text: str) -> str:
    path = pytester.path / "test_suite.py"
    lines = path.read_text().splitlines()
    return f"{path}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def _findings(pytester: pytest.Pytester) -> dict[str, list[dict[str, object]]]:
    data = json.loads((pytester.path / "report.json").read_text())
    return {
        test["nodeid"].split("::")[-1]: test["findings"]
        for test in data["tests"]
        if test.get("findings")
    }


def test_errors_in_a_teardown_are_findings_of_the_test_and_warnings_are_not(
    pytester: pytest.Pytester,
) -> None:
    _suite(pytester, on=True)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-quiet", "--shutdown-report=report.json", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=4, errors=3)
    found = _findings(pytester)
    assert sorted(found) == ["test_child", "test_logged", "test_printed"]
    (logged,) = found["test_logged"]
    assert logged["code"] == "shutdown-logged-error"
    details = logged["details"]
    assert isinstance(details, dict)
    assert details["logger"] == "engine.async_llm"
    assert details["message"] == "AsyncLLM output_handler failed."
    assert details["exception"] == "EngineDeadError"
    assert details["where"] == _site(pytester, "log.exception(")
    (printed,) = found["test_printed"]
    assert printed["details"]["exception"] == "RuntimeError"  # type: ignore[index]
    assert printed["details"]["where"] == _site(pytester, "raise RuntimeError")  # type: ignore[index]
    (child,) = found["test_child"]  # the child's stderr is the inherited, captured fd 2
    assert child["details"]["exception"] == "ConnectionError"  # type: ignore[index]
    output = result.stdout.str()
    assert "shutdown guard: [shutdown-logged-error] " in output
    assert "logger 'engine.async_llm' logged ERROR 'AsyncLLM output_handler failed.'" in output
    # pytest's own capture is unchanged: the record is in its teardown log section
    assert "Captured log teardown" in output
    assert "Captured stderr teardown" in output


def test_warn_mode_warns_and_the_test_passes(pytester: pytest.Pytester) -> None:
    _suite(pytester, on=True)
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-quiet", "-k", "logged or warning"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ShutdownLeakWarning*", "*shutdown-logged-error*"])


def test_the_option_off_finds_nothing_and_installs_nothing(pytester: pytest.Pytester) -> None:
    _suite(pytester, on=False)
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-report=report.json")
    result.assert_outcomes(passed=4)
    assert _findings(pytester) == {}


def test_the_ini_key_and_its_allow_list(pytester: pytest.Pytester) -> None:
    _suite(pytester, on=True)
    pytester.makeini(
        """
        [pytest]
        shutdown_quiet = true
        shutdown_quiet_allow =
            output_handler failed
            ^RuntimeError: socket closed
            ConnectionError
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=4)


@pytest.mark.parametrize(
    ("ini", "expected"),
    [
        ("shutdown_quiet = maybe", "shutdown_quiet (ini): 'maybe' is not accepted; accepted: 1"),
        (
            "shutdown_quiet = on\nshutdown_quiet_allow = (",
            "shutdown_quiet_allow (ini): '(' is not accepted",
        ),
    ],
)
def test_bad_values_are_usage_errors(pytester: pytest.Pytester, ini: str, expected: str) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "shutdown")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert expected in result.stderr.str()


ENGINE_SUITE = """
def test_llm(reference_llm):
    (out,) = reference_llm.generate(["hello"], max_tokens=2)
    assert len(out.token_ids) == 2

def test_manager(engine_manager):
    assert engine_manager.call_utility("ping") == "pong"
"""

FAULTY_ENGINE_SUITE = """
import pytest
from pytest_shutdown.engine.core_proc import ChildFaults
from pytest_shutdown.engine.processes import EngineProcManager
from pytest_shutdown.plugin.fixtures import scaled_down_config


@pytest.fixture
def manager():
    manager = EngineProcManager(scaled_down_config("cpu"), faults=ChildFaults(has_work_raises=True))
    yield manager
    manager.shutdown()  # graceful, and it succeeds; the EngineCore logs an exception


def test_manager(manager):
    assert manager.call_utility("ping") == "pong"
"""


@pytest.mark.long_running(10)
def test_a_clean_reference_engine_shutdown_logs_no_error(pytester: pytest.Pytester) -> None:
    """Never accuse correct code: the reference engine's graceful shutdown, its EngineCore
    processes' stderr included (the inherited fd 2 pytest captures), is quiet."""
    pytest.importorskip("torch")
    pytester.makepyfile(test_engine=ENGINE_SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-quiet", "--shutdown-report=report.json"
    )
    result.assert_outcomes(passed=2)
    assert _findings(pytester) == {}


@pytest.mark.long_running(10)
def test_an_engine_core_that_logs_an_exception_at_shutdown_is_found(
    pytester: pytest.Pytester,
) -> None:
    """The other side on the reference engine: an EngineCore whose clean-exit test raises at
    shutdown logs ``logger.exception`` to its own stderr (a child process's), which is found."""
    pytest.importorskip("torch")
    pytester.makepyfile(test_engine=FAULTY_ENGINE_SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-quiet", "--shutdown-report=report.json"
    )
    result.assert_outcomes(passed=1, errors=1)
    (found,) = _findings(pytester)["test_manager"]
    details = found["details"]
    assert isinstance(details, dict)
    assert details["source"] == "stderr"
    assert details["message"] == "[shutdown] EngineCore: could not tell whether the exit was clean"
    assert details["exception"] == "RuntimeError"
    assert "injected fault: has_work() failed" in str(details["exception_line"])
    assert str(details["where"]).split(":")[0].endswith("core_proc.py"), details


@pytest.mark.parametrize(
    "args",
    [["-s"], ["--capture=sys"], ["-p", "xdist", "-n", "2"]],
    ids=["capture-off", "capture-sys", "xdist"],
)
def test_found_however_stderr_is_captured_and_under_xdist(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    """``-s``: a tee on ``sys.stderr`` reads the teardown's traceback; ``--capture=sys``: pytest's
    section; under xdist the findings travel to the controller's report like the guard's."""
    _suite(pytester, on=True)
    result = pytester.runpytest_subprocess(
        "-p",
        "shutdown",
        "--shutdown-quiet",
        "--shutdown-report=report.json",
        "-k",
        "logged or printed or warning",
        *args,
    )
    result.assert_outcomes(passed=3, errors=2)
    found = _findings(pytester)
    assert sorted(found) == ["test_logged", "test_printed"]
    assert found["test_printed"][0]["details"]["exception"] == "RuntimeError"  # type: ignore[index]
