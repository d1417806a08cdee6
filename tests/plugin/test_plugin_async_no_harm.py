"""Do no harm on asyncio and pyzmq code (issue 48's recording wrappers, tried on real suites):
each shape a real suite showed or could show runs plain, warn and fail in real pytest processes.
Warn gives plain's outcome on every test; fail adds errors only on tests that leak, and the leak
is still found."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest
from inner_runs import run_modes

#: A coroutine dropped unawaited: CPython's warning must point at the line that dropped it, and
#: a filter by module (the dropping module's name) must match it, as without the plugin.
NEVER_AWAITED = textwrap.dedent(
    """
    import warnings

    async def work():
        return 1

    def test_the_warning_points_at_the_line_that_dropped_the_coroutine():
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            work()
        [warning] = [w for w in got if "never awaited" in str(w.message)]
        assert (warning.filename, warning.lineno) == (__file__, 9)

    def test_a_filter_by_module_still_matches():
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", "coroutine", RuntimeWarning, module=__name__)
            work()
        assert not [w for w in got if "never awaited" in str(w.message)]
    """
)


def test_a_never_awaited_warning_keeps_its_location_and_is_still_found(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_dropped=NEVER_AWAITED)
    by_mode = run_modes(pytester)
    names = ("test_the_warning_points_at_the_line_that_dropped_the_coroutine",
             "test_a_filter_by_module_still_matches")  # fmt: skip
    ids = [f"test_dropped.py::{name}" for name in names]
    assert by_mode["plain"] == dict.fromkeys(ids, "PASSED")
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == dict.fromkeys(ids, "ERROR")  # each dropped one: a real leak
    pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-guard=fail",
        "--shutdown-report=r.json",
    )  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    found = {t["nodeid"].split("::")[-1]: t["findings"] for t in report["tests"]}
    for name, line in zip(names, (9, 17), strict=True):
        [finding] = found[name]
        assert finding["code"] == "coroutine-never-awaited"
        where = f"{pytester.path / 'test_dropped.py'}:{line} in {name}"
        assert finding["details"]["created_at"] == where


#: A test sets a new loop as the current one and leaves it open; the next test runs on it.
#: pytest-asyncio's autouse session fixture ``event_loop_policy`` returns asyncio's global
#: policy, which reaches that loop: the loop is the global's (long-lived), not the fixture's,
#: and fail mode never errors (nor closes the loop under) the test that only used it.
SET_EVENT_LOOP = textwrap.dedent(
    """
    import asyncio

    def test_sets_a_loop():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(asyncio.sleep(0))

    def test_uses_the_current_loop():
        loop = asyncio.get_event_loop()
        assert loop.run_until_complete(asyncio.sleep(0, result=3)) == 3
    """
)


def test_a_loop_the_global_policy_holds_is_not_blamed_on_the_test_that_tears_its_fixture_down(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("pytest_asyncio", reason="the dev extra installs pytest-asyncio")
    pytester.makepyfile(test_current_loop=SET_EVENT_LOOP)
    by_mode = run_modes(pytester, "-W", "ignore::DeprecationWarning")
    first, second = (f"test_current_loop.py::{name}" for name in
                     ("test_sets_a_loop", "test_uses_the_current_loop"))  # fmt: skip
    assert by_mode["plain"] == {first: "PASSED", second: "PASSED"}
    assert by_mode["warn"] == by_mode["plain"]
    # the loop's selector and self-pipe, never closed: the first test's real leak
    assert by_mode["fail"] == {first: "ERROR", second: "PASSED"}
    pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-guard=fail",
        "-W", "ignore::DeprecationWarning", "--shutdown-report=r.json",
    )  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    found = {t["nodeid"]: [f["code"] for f in t["findings"]] for t in report["tests"]}
    assert found[first] == ["fd-leak"] and not found.get(second)
    [loop] = [r for r in report["long_lived"] if r["kind"] == "asyncio"]
    assert loop["owner"]["kind"] == "module-global" and loop["first_test"] == first


#: Errors raised through the recording wrappers: a bind to a port in use, a task on a closed
#: loop. The user's traceback must show the frames it shows without the plugin; and a loop
#: left open is still found.
RAISED_THROUGH_WRAPPERS = textwrap.dedent(
    """
    import asyncio
    import zmq

    def test_bind_twice():
        ctx = zmq.Context()
        a, b = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
        try:
            port = a.bind_to_random_port("tcp://127.0.0.1")
            b.bind(f"tcp://127.0.0.1:{port}")
        finally:
            a.close(0)
            b.close(0)
            ctx.term()

    async def work():
        pass

    def test_task_on_a_closed_loop():
        loop = asyncio.new_event_loop()
        loop.close()
        coro = work()
        try:
            loop.create_task(coro)
        finally:
            coro.close()

    def test_zz_leaves_a_loop_open():
        asyncio.new_event_loop().run_until_complete(asyncio.sleep(0))
    """
)


def _traceback_frames(result: pytest.RunResult) -> list[str]:
    """The location lines of the failures' tracebacks (``file.py:12: in name``)."""
    return [line for line in result.outlines if re.match(r"^\S+\.py:\d+: ", line)]


def test_a_traceback_through_a_recording_wrapper_shows_the_frames_it_shows_plain(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("zmq", reason="the dev extra installs pyzmq")
    pytester.makepyfile(test_raised=RAISED_THROUGH_WRAPPERS)
    common = ("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
    plain = pytester.runpytest_subprocess("-p", "no:shutdown", *common, timeout=90)
    plain.assert_outcomes(passed=1, failed=2)
    frames = _traceback_frames(plain)
    assert any("zmq" in line for line in frames) and any("asyncio" in line for line in frames)
    for mode in ("warn", "fail"):
        guarded = pytester.runpytest_subprocess(
            "-p", "shutdown", f"--shutdown-guard={mode}", "--shutdown-report=r.json", *common,
            timeout=90,
        )  # fmt: skip
        assert _traceback_frames(guarded) == frames
        assert "pytest_shutdown" not in "\n".join(frames)
        report = json.loads((pytester.path / "r.json").read_text())
        [leaky] = [t for t in report["tests"] if t["findings"]]
        assert leaky["nodeid"].endswith("test_zz_leaves_a_loop_open")
        assert "loop-left" in {finding["code"] for finding in leaky["findings"]}


#: asgiref's test_server shape: gather() left a sibling task running, its loop's runner (the
#: pytest-asyncio loop fixture) cancelled it; and a coroutine dropped unawaited. Both are over
#: when the test ends: nothing a grace can change.
OVER_WHEN_THE_TEST_ENDS = textwrap.dedent(
    """
    import asyncio
    import pytest

    class Done(Exception):
        pass

    async def checker():
        while True:
            await asyncio.sleep(0.01)

    async def handle():
        await asyncio.sleep(0)
        raise Done

    @pytest.mark.asyncio
    async def test_gather_leaves_a_sibling_to_the_runner():
        try:
            await asyncio.gather(checker(), handle())
        except Done:
            pass

    def test_a_coroutine_never_awaited():
        handle()

    def test_after():
        pass
    """
)


def test_warn_mode_reports_what_is_already_over_with_its_test(pytester: pytest.Pytester) -> None:
    """Warn mode defers a verdict only for what may still end within the grace: an event is
    reported with its test (a warning at its line, its junit property), never as "still running
    when the session ended"; outcomes as plain; fail mode errors both tests."""
    pytest.importorskip("pytest_asyncio", reason="the dev extra installs pytest-asyncio")
    pytester.makepyfile(test_over=OVER_WHEN_THE_TEST_ENDS)
    by_mode = run_modes(pytester, "-o", "asyncio_default_fixture_loop_scope=function")
    names = ("test_gather_leaves_a_sibling_to_the_runner", "test_a_coroutine_never_awaited")
    leaky = {f"test_over.py::{name}" for name in names}
    assert set(by_mode["plain"].values()) == {"PASSED"} and len(by_mode["plain"]) == 3
    assert by_mode["warn"] == by_mode["plain"]
    assert {k for k, v in by_mode["fail"].items() if v != "PASSED"} == leaky
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-guard=warn", "--junitxml=j.xml",
        "-o", "asyncio_default_fixture_loop_scope=function",
    )  # fmt: skip
    result.assert_outcomes(passed=3)
    assert "still running when the session ended" not in result.stdout.str()
    assert "confirmed once its" not in result.stdout.str()
    junit = (pytester.path / "j.xml").read_text()
    for name, code in zip(names, ("task-leak", "coroutine-never-awaited"), strict=True):
        case = junit[junit.index(f'name="{name}"') :]
        case = case[: case.index("</testcase>")]
        assert f'name="shutdown:{code}"' in case


#: asyncio's debug mode (anyio's plugin runs its loops so): a task keeps the stack it was
#: created from, shown in asyncio's logs. It must end at the caller, as without the plugin; the
#: task, left pending for asyncio.run to cancel, is still found.
DEBUG_MODE_TASK = textwrap.dedent(
    """
    import asyncio

    async def forever():
        await asyncio.sleep(100)

    def test_the_task_was_created_from_its_caller():
        async def main():
            task = asyncio.get_running_loop().create_task(forever())
            await asyncio.sleep(0)
            return task
        task = asyncio.run(main(), debug=True)
        stack = task._source_traceback
        assert stack[-1].name == "main", stack
        assert not [frame for frame in stack if "pytest_shutdown" in frame.filename], stack
    """
)


def test_a_debug_mode_tasks_creation_stack_has_no_frame_of_the_recorder(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_debug=DEBUG_MODE_TASK)
    by_mode = run_modes(pytester, "-p", "no:asyncio")
    name = "test_debug.py::test_the_task_was_created_from_its_caller"
    assert by_mode["plain"] == {name: "PASSED"}
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == {name: "ERROR"}  # the task left for asyncio.run to cancel


#: anyio's test_base_exception / test_unhandled_exception_group shape: a SystemExit (or a
#: KeyboardInterrupt) out of a task interrupts the run; asyncio.run's close then cancels what
#: was pending (the main task, its task group's children): cut short, not left. Beside it, an
#: ordinary exception out of main leaves main's unawaited task for the runner: a real leak.
INTERRUPTED_RUN = textwrap.dedent(
    """
    import asyncio
    import pytest

    async def sleeper():
        await asyncio.sleep(100)

    async def exits():
        await asyncio.sleep(0)
        raise SystemExit(5)

    def test_a_run_interrupted_by_system_exit():
        async def main():
            async with asyncio.TaskGroup() as group:
                group.create_task(sleeper())
                group.create_task(exits())
        with pytest.raises(SystemExit):
            asyncio.run(main())

    def test_a_run_that_raises_leaves_its_task():
        async def main():
            asyncio.get_running_loop().create_task(sleeper())  # never awaited
            await asyncio.sleep(0)
            raise ValueError("main failed")
        with pytest.raises(ValueError):
            asyncio.run(main())
    """
)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is 3.11's")
def test_what_an_interrupted_run_cut_short_is_no_task_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_interrupted=INTERRUPTED_RUN)
    by_mode = run_modes(pytester, "-p", "no:asyncio")
    interrupted, raises = (f"test_interrupted.py::{name}" for name in
                           ("test_a_run_interrupted_by_system_exit",
                            "test_a_run_that_raises_leaves_its_task"))  # fmt: skip
    assert by_mode["plain"] == {interrupted: "PASSED", raises: "PASSED"}
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == {interrupted: "PASSED", raises: "ERROR"}
