"""The guard end to end, with real pytest runs (pytester): both sides of every behaviour."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

import pytest

GRACE = "--shutdown-grace=0.3"


def test_guard_fails_exactly_the_leaky_tests(leaky_suite: pytest.Pytester) -> None:
    result = leaky_suite.runpytest_subprocess(
        "-p", "shutdown", GRACE, "--shutdown-report=report.json", "--junitxml=junit.xml"
    )
    result.assert_outcomes(passed=4, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*guard fail (grace 0.3 s, budget none)*",
            "ERROR test_leaky.py::test_thread_leak - shutdown guard: [[]thread-leak]*",
            "ERROR test_leaky.py::test_process_leak - shutdown guard: [[]process-leak]*",
            "ERROR test_leaky.py::test_freeze_leak - shutdown guard: [[]gc-frozen-leak]*",
        ]
    )
    out = result.stdout.str()
    assert "ERROR at teardown of test_clean" not in out
    # The failure names the thread with its stack and the process with its command line.
    result.stdout.fnmatch_lines(["*thread 'leaky-thread'*", "*in wait*", "*process * (python*"])
    assert "os.getppid()" in out

    report = json.loads((leaky_suite.path / "report.json").read_text())
    assert report["schema_version"] == 1
    assert report["guard"] == "fail" and report["grace_s"] == 0.3
    assert report["platform"] == "auto"
    codes = {t["nodeid"]: [f["code"] for f in t["findings"]] for t in report["tests"]}
    assert codes == {
        "test_leaky.py::test_thread_leak": ["thread-leak"],
        "test_leaky.py::test_process_leak": ["process-leak"],
        "test_leaky.py::test_freeze_leak": ["gc-frozen-leak"],
    }
    assert report["summary"]["tests"] == 4
    assert report["durations"]["count"] == 4
    by_id = {t["nodeid"]: t for t in report["tests"]}
    thread = by_id["test_leaky.py::test_thread_leak"]["findings"][0]["details"]["threads"][0]
    assert thread["name"] == "leaky-thread" and "wait" in thread["stack"]

    properties = {
        (p.get("name"), p.get("value", "").split(" ")[0])
        for p in ET.parse(leaky_suite.path / "junit.xml").iter("property")
    }
    assert ("shutdown:thread-leak", "1") in properties
    assert {name for name, _ in properties} == {
        "shutdown:thread-leak",
        "shutdown:process-leak",
        "shutdown:gc-frozen-leak",
    }


def test_same_suite_passes_without_the_guard(leaky_suite: pytest.Pytester) -> None:
    result = leaky_suite.runpytest_subprocess()
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*pytest-shutdown*guard off*"])
    assert "= shutdown =" not in result.stdout.str()

    off = leaky_suite.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=off")
    off.assert_outcomes(passed=4)
    assert "= shutdown =" not in off.stdout.str()


def test_clean_suite_passes_under_the_guard(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import sys

        def pytest_sessionfinish(session):
            assert "torch" not in sys.modules, "loading the plugin imported torch"
        """
    )
    pytester.makepyfile(
        test_clean=textwrap.dedent(
            """
            import gc, subprocess, sys, threading
            from concurrent.futures import ThreadPoolExecutor
            import pytest

            @pytest.fixture(scope="module")
            def service():
                stop = threading.Event()
                thread = threading.Thread(target=stop.wait, name="service")
                thread.start()
                yield thread
                stop.set()
                thread.join()

            @pytest.fixture
            def child():
                proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
                yield proc
                proc.kill()
                proc.wait()

            def test_pool():
                with ThreadPoolExecutor(4) as pool:
                    assert sum(pool.map(abs, range(-5, 5))) == 25

            def test_uses_service(service, child):
                assert service.is_alive() and child.poll() is None

            def test_uses_service_again(service):
                assert service.is_alive()

            def test_freeze_undone():
                gc.freeze()
                gc.unfreeze()
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "-v", GRACE)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*= shutdown =*",
            "no findings in 4 tests (guard in fail mode, grace 0.3 s)",
            "shutdown durations: median * s, max * s over 4 tests",
        ]
    )


def test_warn_mode_warns_and_passes(leaky_suite: pytest.Pytester) -> None:
    result = leaky_suite.runpytest_subprocess("--shutdown-guard=warn", GRACE)
    result.assert_outcomes(passed=4, warnings=3)
    # The thread and the process are confirmed once their grace ran out while the next tests
    # ran (here: at session end), after the freeze's warning: each line on its own.
    for line in (
        "*ShutdownLeakWarning: [[]thread-leak] 1 thread started in test_thread_leak*",
        "*ShutdownLeakWarning: [[]process-leak]*",
        "*ShutdownLeakWarning: [[]gc-frozen-leak]*",
    ):
        result.stdout.fnmatch_lines([line])


def test_ini_turns_the_guard_on_and_off(leaky_suite: pytest.Pytester) -> None:
    leaky_suite.makeini("[pytest]\nshutdown_guard = fail\nshutdown_grace = 0.3\n")
    leaky_suite.runpytest_subprocess().assert_outcomes(passed=4, errors=3)

    # The ini 'off' keeps the guard off even when -p shutdown loads the plugin (e.g. for the
    # fixtures with autoload disabled); the command line wins over the ini.
    leaky_suite.makeini("[pytest]\nshutdown_guard = off\n")
    leaky_suite.runpytest_subprocess("-p", "shutdown").assert_outcomes(passed=4)
    on = leaky_suite.runpytest_subprocess("--shutdown-guard=warn", GRACE)
    on.assert_outcomes(passed=4, warnings=3)


def test_with_plugin_autoload_disabled_only_p_shutdown_loads_it(
    leaky_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    loaded = leaky_suite.runpytest_subprocess("-p", "shutdown", GRACE)
    loaded.assert_outcomes(passed=4, errors=3)
    not_loaded = leaky_suite.runpytest_subprocess()
    not_loaded.assert_outcomes(passed=4)
    assert "pytest-shutdown" not in not_loaded.stdout.str()


def test_allow_leaks_opts_out_per_kind(pytester: pytest.Pytester, child_script: str) -> None:
    pytester.makepyfile(
        test_allow=textwrap.dedent(
            f"""
            import gc, subprocess, sys, threading
            import pytest

            CHILD = "{child_script}"
            release = threading.Event()

            def park(name):
                threading.Thread(target=release.wait, name=name, daemon=True).start()

            @pytest.mark.allow_leaks(reason="everything on purpose")
            def test_all_allowed():
                park("anything")
                gc.freeze()
                gc.unfreeze()

            @pytest.mark.allow_leaks(threads=["poller-*"], reason="a known poller")
            def test_pattern_allowed():
                park("poller-1")

            @pytest.mark.allow_leaks(threads=["poller-*"], reason="a known poller")
            def test_pattern_not_matching():
                park("other-1")

            @pytest.mark.allow_leaks(processes=True, reason="a daemon process")
            def test_processes_allowed_but_not_threads():
                subprocess.Popen([sys.executable, "-c", CHILD])
                park("not-allowed")

            @pytest.mark.allow_leaks(gc_freeze=True, reason="frozen on purpose")
            def test_freeze_allowed():
                gc.freeze()
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE)
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines(
        [
            "ERROR test_allow.py::test_pattern_not_matching - shutdown guard: *",
            "ERROR test_allow.py::test_processes_allowed_but_not_threads - shutdown guard*",
        ]
    )


def test_markers_a_conftest_adds_while_collecting_count(pytester: pytest.Pytester) -> None:
    """A conftest that marks tests in its own ``pytest_collection_modifyitems`` (a common way
    to mark a whole folder): the guard reads the markers after it, and a bad one it adds is
    the usage error a bad marker is; a test deselected by ``-k`` is not asked."""
    pytester.makeconftest(
        """
        import pytest

        def pytest_collection_modifyitems(items):
            for item in items:
                if "poller" in item.name:
                    item.add_marker(pytest.mark.allow_leaks(threads=True, reason="a poller"))
                if "bad" in item.name:
                    item.add_marker(pytest.mark.shutdown_budget(-1))
        """
    )
    pytester.makepyfile(
        test_marked_by_conftest="""
        import threading

        release = threading.Event()

        def test_poller():
            threading.Thread(target=release.wait, name="poller", daemon=True).start()

        def test_unmarked_leak():
            threading.Thread(target=release.wait, name="other", daemon=True).start()

        def test_bad_budget():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "-k", "not bad")
    result.assert_outcomes(passed=2, errors=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["ERROR test_marked_by_conftest.py::test_unmarked_leak - shutdown guard*"]
    )
    bad = pytester.runpytest_subprocess("-p", "shutdown", GRACE)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR, bad.stdout.str()
    bad.stderr.fnmatch_lines(["*test_bad_budget*shutdown_budget*seconds >= 0*"])


def test_wider_scope_fixture_owns_its_threads_and_processes(
    pytester: pytest.Pytester, child_script: str
) -> None:
    pytester.makepyfile(
        test_scope=textwrap.dedent(
            f"""
            import subprocess, sys, threading
            import pytest

            CHILD = "{child_script}"

            @pytest.fixture(scope="module")
            def leaky_service():
                threading.Thread(
                    target=threading.Event().wait, name="service-thread", daemon=True
                ).start()
                subprocess.Popen([sys.executable, "-c", CHILD])
                yield

            def test_first(leaky_service):
                pass

            def test_second(leaky_service):
                pass

            def test_unrelated():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "--shutdown-report=r.json")
    # Not blamed on test_first, which first requested it: on the fixture, at its teardown
    # (after the last test of the module).
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_unrelated: [[]thread-leak] 1 thread started in fixture 'leaky_service' "
            "(module scope)*'service-thread'*",
            "*test_unrelated: [[]process-leak] 1 child process started in fixture "
            "'leaky_service' (module scope)*",
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    (record,) = report["tests"]
    owners = [f["details"]["owner"] for f in record["findings"]]
    assert (
        owners == [{"fixture": "leaky_service", "scope": "module", "baseid": "test_scope.py"}] * 2
    )


def test_guard_restores_order_for_the_next_test(
    pytester: pytest.Pytester, child_script: str
) -> None:
    pytester.makepyfile(
        test_order=textwrap.dedent(
            f"""
            import gc, pathlib, subprocess, sys, threading
            import psutil

            CHILD = "{child_script}"

            def test_leaks_everything():
                proc = subprocess.Popen([sys.executable, "-c", CHILD])
                pathlib.Path("child.pid").write_text(str(proc.pid))
                threading.Thread(
                    target=threading.Event().wait, name="named-once", daemon=True
                ).start()
                gc.freeze()

            def test_next_starts_clean():
                pid = int(pathlib.Path("child.pid").read_text())
                status = psutil.Process(pid).status() if psutil.pid_exists(pid) else "gone"
                assert status in ("gone", psutil.STATUS_ZOMBIE), status
                assert gc.get_freeze_count() == 0
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE)
    result.assert_outcomes(passed=2, errors=1)
    # The leaked thread is named once, then part of the baseline: never blamed on the next test.
    assert "test_next_starts_clean: [" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        ["shutdown guard: [[]thread-leak] *; [[]process-leak] *; [[]gc-frozen-leak] *"]
    )


def freezing_fixture(name: str, *teardown: str) -> str:
    """An inner test file's start: ``import gc, pytest`` and a module-scope fixture ``name``
    that calls ``gc.freeze()``, yields, then runs the ``teardown`` lines."""
    lines = ["import gc", "import pytest", "", '@pytest.fixture(scope="module")', f"def {name}():"]
    lines += [f"    {line}" for line in ("gc.freeze()", "yield", *teardown)]
    return "\n".join(lines) + "\n"


def run_reporting_test_leaks_a_freeze(pytester: pytest.Pytester) -> pytest.RunResult:
    """Run the suite: three tests pass, test_leaks_a_freeze has an error naming its freeze."""
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", GRACE)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_leaks_a_freeze: [[]gc-frozen-leak] gc.get_freeze_count() went from * to *"]
    )
    return result


def test_a_freeze_left_behind_is_undone_whatever_was_frozen_before_the_session(
    pytester: pytest.Pytester,
) -> None:
    # A conftest that freezes at import: the session starts with a nonzero freeze count on every
    # Python, as a bare CPython 3.12.1 does (375). The test's freeze is undone all the same, and
    # the pre-session freeze with it (gc.unfreeze() cannot tell them apart: docs/limits.md).
    pytester.makeconftest("import gc\ngc.freeze()\n")
    pytester.makepyfile(
        test_frozen_at_start=textwrap.dedent(
            """
            import gc

            AT_START = gc.get_freeze_count()

            def test_starts_frozen():
                assert AT_START > 0

            def test_leaks_a_freeze():
                gc.freeze()

            def test_next_starts_unfrozen():
                assert gc.get_freeze_count() == 0
            """
        )
    )
    result = run_reporting_test_leaks_a_freeze(pytester)
    assert "test_next_starts_unfrozen: [" not in result.stdout.str()


def test_a_freeze_on_top_of_a_wider_scope_fixtures_is_left_alone(pytester: pytest.Pytester) -> None:
    # Unfreezing would release the fixture's freeze in the middle of its scope: the test's
    # freeze is reported and left, and the fixture's teardown still finds its heap frozen.
    pytester.makepyfile(
        test_held=freezing_fixture(
            "frozen_heap",
            "assert gc.get_freeze_count() > 0, \"the fixture's freeze was released\"",
            "gc.unfreeze()",
        )
        + textwrap.dedent(
            """
            KEPT = []

            def test_sets_the_fixture_up(frozen_heap):
                pass

            def test_leaks_a_freeze(frozen_heap):
                KEPT.extend({} for _ in range(100))  # new objects that outlive the test
                gc.freeze()

            def test_still_frozen(frozen_heap):
                assert gc.get_freeze_count() > len(KEPT)
            """
        )
    )
    run_reporting_test_leaks_a_freeze(pytester)


def test_markers_are_registered_for_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.engine(data_parallel_size=2)
        @pytest.mark.shutdown_matrix(request=[0], process=[0], platform=["rocm"])
        @pytest.mark.shutdown_budget(5)
        @pytest.mark.allow_leaks(reason="documented")
        def test_marked():
            pass
        """
    )
    pytester.runpytest_subprocess("--strict-markers").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.allow_leaks(*", "@pytest.mark.shutdown_budget(*", "@pytest.mark.engine(*"]
    )


def test_gc_freeze_of_a_wider_scope_fixture_is_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a_frozen_ok=freezing_fixture("frozen_ok", "gc.unfreeze()")
        + textwrap.dedent(
            """
            def test_one(frozen_ok):
                pass

            def test_two(frozen_ok):
                pass
            """
        ),
        test_b_frozen_leak=freezing_fixture("frozen_leak")
        + textwrap.dedent(
            """
            def test_one(frozen_leak):
                pass

            def test_two(frozen_leak):
                pass
            """
        ),
        test_c_after=textwrap.dedent(
            """
            import gc

            AT_COLLECTION = gc.get_freeze_count()  # 0, or 375 on CPython 3.12.1

            def test_restored():
                assert gc.get_freeze_count() <= AT_COLLECTION
            """
        ),
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE)
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(
        [
            # from 0 after test_a's unfreeze; from 375 on CPython 3.12.1 when test_b runs first
            "test_b_frozen_leak.py::test_two: [[]gc-frozen-leak] gc.get_freeze_count() went from *"
            " to * in fixture 'frozen_leak' (module scope)*",
        ]
    )
