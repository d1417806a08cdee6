"""The asyncio kind (issue 48, point 2): tasks left pending, loops never closed, async generators
never finalized, coroutines never awaited; both sides, with real pytest runs (``-p shutdown``),
beside pytest-asyncio (strict and auto, function/module/session loops) and anyio's plugin."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("pytest_asyncio", reason="the dev extra installs pytest-asyncio")
pytest.importorskip("anyio", reason="the dev extra installs anyio")

LEAKY = textwrap.dedent(
    """
    import asyncio

    async def handler():
        await asyncio.sleep(100)

    def test_task_left_for_asyncio_run():
        async def main():
            asyncio.get_running_loop().create_task(handler())  # never cancelled
            await asyncio.sleep(0)
        asyncio.run(main())

    def test_task_pending_on_a_closed_loop():
        loop = asyncio.new_event_loop()
        task = loop.create_task(handler())
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        del task  # collected pending: "Task was destroyed but it is pending!"

    def test_loop_left_open():
        loop = asyncio.new_event_loop()
        loop.run_until_complete(asyncio.sleep(0))

    def test_async_generator_not_finalized():
        async def gen():
            try:
                yield 1
                yield 2
            finally:
                pass
        loop = asyncio.new_event_loop()
        async def main():
            agen = gen()
            await agen.__anext__()
            return agen
        agen = loop.run_until_complete(main())
        loop.close()  # no loop.shutdown_asyncgens() first
        del agen

    def test_coroutine_never_awaited():
        handler()
    """
)

CLEAN = textwrap.dedent(
    """
    import asyncio

    async def handler():
        await asyncio.sleep(100)

    def test_asyncio_run():
        async def main():
            task = asyncio.create_task(handler())
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        asyncio.run(main())

    def test_loop_closed():
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(asyncio.sleep(0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def test_async_for_break():
        async def gen():
            yield 1
            yield 2
        async def main():
            async for _ in gen():
                break
        asyncio.run(main())

    def test_awaited():
        async def main():
            await asyncio.sleep(0)
        asyncio.run(main())
    """
)


def _report(pytester: pytest.Pytester) -> dict:  # type: ignore[type-arg]
    return json.loads((pytester.path / "r.json").read_text())


def _findings(pytester: pytest.Pytester) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    return {
        t["nodeid"].split("::")[-1]: t["findings"]
        for t in _report(pytester)["tests"]
        if t["findings"]
    }


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-grace=0.2",
        "--shutdown-report=r.json", *args,
    )  # fmt: skip


@pytest.mark.parametrize("warn", [False, True], ids=["fail", "warn"])
def test_each_asyncio_leak_is_found_with_its_code_and_site(
    pytester: pytest.Pytester, warn: bool
) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = _run(pytester, *(["--shutdown-guard=warn"] if warn else []))
    result.assert_outcomes(passed=5, errors=0 if warn else 5)
    found = _findings(pytester)
    codes = {name: [f["code"] for f in fs if f["code"] != "fd-leak"] for name, fs in found.items()}
    assert codes == {
        "test_task_left_for_asyncio_run": ["task-leak"],
        "test_task_pending_on_a_closed_loop": ["task-leak"],
        "test_loop_left_open": ["loop-left"],
        "test_async_generator_not_finalized": ["asyncgen-left"],
        "test_coroutine_never_awaited": ["coroutine-never-awaited"],
    }
    by_code = {f["code"]: f for fs in found.values() for f in fs}
    runner = found["test_task_left_for_asyncio_run"][0]
    assert runner["details"]["state"] == "cancelled-by-runner"
    assert runner["details"]["name"] == "test_leaky.handler"
    assert runner["details"]["created_at"].startswith(str(pytester.path / "test_leaky.py:8 "))
    assert "still pending when its event loop's runner shut down" in runner["message"]
    pending = found["test_task_pending_on_a_closed_loop"][0]
    # pending when the test ended (or already collected pending, when a collection came first)
    assert pending["details"]["state"] in ("task", "destroyed-pending")
    assert ":14 in test_task_pending_on_a_closed_loop" in pending["details"]["created_at"]
    assert pending["details"]["waiting_at"].endswith("test_leaky.py:4")
    assert ":20 in test_loop_left_open" in by_code["loop-left"]["details"]["created_at"]
    agen = by_code["asyncgen-left"]
    assert agen["details"]["name"] == "test_leaky.test_async_generator_not_finalized.<locals>.gen"
    assert "shutdown_asyncgens" in agen["message"]
    coro = by_code["coroutine-never-awaited"]
    assert coro["details"]["name"] == "test_leaky.handler"
    assert coro["details"]["defined_at"].endswith("test_leaky.py:3")
    assert ":40 in test_coroutine_never_awaited" in coro["details"]["created_at"]


def test_the_warning_is_left_to_the_users_filters(pytester: pytest.Pytester) -> None:
    """Warn mode observes: the RuntimeWarning is still issued, and -W error still applies."""
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "-p", "no:randomly", "-k", "never_awaited",
        "-W", "error::RuntimeWarning",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*coroutine 'handler' was never awaited*"])
    result.stdout.fnmatch_lines(["*coroutine-never-awaited*"])


def test_clean_asyncio_code_gives_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_clean=CLEAN)
    result = _run(pytester)
    result.assert_outcomes(passed=4)
    assert _findings(pytester) == {}


PYTEST_ASYNCIO = textwrap.dedent(
    """
    import asyncio
    import pytest
    import pytest_asyncio

    async def forever():
        await asyncio.sleep(100)

    @pytest_asyncio.fixture(scope="session", loop_scope="session")
    async def service():
        task = asyncio.create_task(forever())  # the fixture's: long-lived, cancelled at its end
        yield task
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    @pytest_asyncio.fixture
    async def per_test():
        await asyncio.sleep(0)
        yield 1

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def per_module():
        yield 2

    @pytest.mark.asyncio
    async def test_function_loop(per_test):
        await asyncio.sleep(0)

    @pytest.mark.asyncio(loop_scope="module")
    async def test_module_loop(per_module):
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))

    @pytest.mark.asyncio(loop_scope="session")
    async def test_session_loop(service):
        assert not service.done()
        if not hasattr(asyncio, "TaskGroup"):  # Python 3.10
            await asyncio.ensure_future(asyncio.sleep(0))
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(0))

    @pytest.mark.asyncio(loop_scope="session")
    async def test_session_loop_again(service):
        assert not service.done()

    @pytest.mark.asyncio
    async def test_async_for_break():
        async def gen():
            yield 1
            yield 2
        async for _ in gen():
            break
    """
)

ANYIO = textwrap.dedent(
    """
    import anyio
    import pytest

    pytestmark = pytest.mark.anyio

    @pytest.fixture(scope="module")
    def anyio_backend():
        return "asyncio"

    @pytest.fixture(scope="module")
    async def resource():
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.sleep, 0)
        yield 3

    async def test_task_group(resource):
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.sleep, 0)

    async def test_sleep():
        await anyio.sleep(0)
    """
)


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_pytest_asyncio_and_anyio_suites_give_nothing(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makepyfile(test_pa=PYTEST_ASYNCIO, test_anyio_suite=ANYIO)
    result = _run(
        pytester, "-o", f"asyncio_mode={mode}", "-o", "asyncio_default_fixture_loop_scope=function"
    )
    result.assert_outcomes(passed=7)
    assert _findings(pytester) == {}


LEAKY_PYTEST_ASYNCIO = textwrap.dedent(
    """
    import asyncio
    import pytest

    async def forever():
        await asyncio.sleep(100)

    @pytest.mark.asyncio
    async def test_left_on_the_function_loop():
        asyncio.create_task(forever())
        await asyncio.sleep(0)

    @pytest.mark.asyncio(loop_scope="session")
    async def test_left_on_the_session_loop():
        asyncio.create_task(forever())
        await asyncio.sleep(0)

    def test_after():  # the session loop lives on after the test above: its task is pending
        pass
    """
)


def test_a_task_left_on_a_pytest_asyncio_loop_is_the_tests(pytester: pytest.Pytester) -> None:
    """The function loop's teardown cancels it (cancelled-by-runner); on the session loop it is
    still pending when the test ends: the test's, not the session loop fixture's."""
    pytester.makepyfile(test_pa=LEAKY_PYTEST_ASYNCIO)
    result = _run(pytester, "-o", "asyncio_default_fixture_loop_scope=function")
    result.assert_outcomes(passed=3, errors=2)
    found = _findings(pytester)
    states = {name: [f["details"]["state"] for f in fs] for name, fs in found.items()}
    assert states == {
        "test_left_on_the_function_loop": ["cancelled-by-runner"],
        "test_left_on_the_session_loop": ["task"],
    }


def test_a_session_fixture_that_never_stops_its_task_is_blamed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_pa="""
        import asyncio
        import pytest
        import pytest_asyncio

        @pytest_asyncio.fixture(scope="session", loop_scope="session")
        async def service():
            yield asyncio.create_task(asyncio.sleep(100))  # never cancelled

        @pytest.mark.asyncio(loop_scope="session")
        async def test_uses(service):
            await asyncio.sleep(0)

        @pytest.mark.asyncio(loop_scope="session")
        async def test_uses_again(service):
            await asyncio.sleep(0)
        """
    )
    _run(pytester, "-o", "asyncio_default_fixture_loop_scope=function")
    found = _findings(pytester)
    assert list(found) == ["test_uses_again"]  # the last test, where the session ends
    (finding,) = found["test_uses_again"]
    assert finding["code"] == "task-leak"
    assert finding["details"]["owner"]["fixture"] == "service"


def test_allow_leaks_asyncio_silences_the_kind(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_allowed="""
        import asyncio
        import pytest

        @pytest.mark.allow_leaks(asyncio=True, reason="a loop kept on purpose")
        def test_open_loop():
            asyncio.new_event_loop()
        """
    )
    result = _run(pytester, "-W", "ignore::ResourceWarning")
    result.assert_outcomes(passed=1)


RECORD = """
import json, sys

def pytest_sessionfinish(session):
    with open("imported.json", "w") as out:
        json.dump("asyncio" in sys.modules, out)
"""


def test_a_suite_that_never_imports_asyncio_does_not_import_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORD)
    pytester.makepyfile(test_trivial="def test_one():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:asyncio", "-p", "no:anyio", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "imported.json").read_text()) is False


def test_a_loop_made_after_asyncio_is_first_imported_in_a_test_is_found(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_late="""
        def test_imports_and_leaves_a_loop():
            import asyncio
            asyncio.new_event_loop()
        """
    )
    _run(pytester, "-p", "no:asyncio", "-p", "no:anyio", "-W", "ignore::ResourceWarning")
    found = _findings(pytester)
    codes = [f["code"] for f in found["test_imports_and_leaves_a_loop"] if f["code"] != "fd-leak"]
    assert codes == ["loop-left"]
