"""What a module creates while it is imported belongs to the import; a library's singleton's
``atexit`` registration is how it is meant to end (issue 45, items 3 and 4)."""

from __future__ import annotations

import json
import textwrap

import pytest


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A run in fail mode (the default)."""
    return pytester.runpytest_subprocess(
        "-p",
        "shutdown",
        "--shutdown-grace=0.2",
        "--shutdown-report=r.json",
        "-p",
        "no:randomly",
        *args,
    )


def _run_a_test_importing(pytester: pytest.Pytester, **module: str) -> pytest.RunResult:
    """A run of one test that imports ``module`` (name=source), and passes."""
    ((name, source),) = module.items()
    pytester.makepyfile(
        **{name: source, "test_imports": f"def test_imports():\n    import {name}  # noqa: F401\n"}
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    return result


def _report(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "r.json").read_text())


STARTS_AT_IMPORT = textwrap.dedent(
    """
    import threading

    _stop = threading.Event()

    def _serve():
        _stop.wait()

    threading.Thread(target=_serve, name="import-time-worker", daemon=True).start()
    """
)

STARTS_WHEN_CALLED = textwrap.dedent(
    """
    import threading

    _stop = threading.Event()

    def start():
        threading.Thread(target=_stop.wait, name="test-time-worker", daemon=True).start()
    """
)


def test_a_thread_started_by_an_import_is_the_imports(pytester: pytest.Pytester) -> None:
    """A daemon thread a module starts (and keeps nowhere) while the test imports it is no
    finding in fail mode: it is listed as long-lived, owned by that module's import."""
    result = _run_a_test_importing(pytester, importworker=STARTS_AT_IMPORT)
    assert "thread-leak" not in result.stdout.str()
    report = _report(pytester)
    assert report["tests"] == []
    assert [(r["name"], r["owner"]["kind"], r["owner"]["name"]) for r in report["long_lived"]] == [
        ("import-time-worker", "import", "importworker")
    ]


def test_the_same_thread_started_in_the_test_body_is_a_leak(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        testworker=STARTS_WHEN_CALLED,
        test_calls=("import testworker\n\ndef test_starts():\n    testworker.start()\n"),
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*thread-leak*test-time-worker*"])


SETS_AT_IMPORT = textwrap.dedent(
    """
    import os

    os.environ["IMPORT_TIME_FLAG_A4W4"] = "1"
    """
)


def test_an_environment_variable_set_by_an_import_is_the_imports(
    pytester: pytest.Pytester,
) -> None:
    result = _run_a_test_importing(pytester, setsflag=SETS_AT_IMPORT)
    assert "global-state" not in result.stdout.str()


def test_the_same_variable_set_by_the_test_is_its_own(pytester: pytest.Pytester) -> None:
    """A module that sets the variable was imported before (at collection): the test's own
    setting of it is reported, and so is a test's that imports an unrelated module."""
    pytester.makepyfile(
        setsflag=SETS_AT_IMPORT,
        other="VALUE = 1\n",
        test_env=textwrap.dedent(
            """
            import os
            import setsflag  # noqa: F401

            def test_sets_it():
                os.environ["IMPORT_TIME_FLAG_A4W4"] = "2"

            def test_imports_another_and_sets_it():
                import other  # noqa: F401
                os.environ["IMPORT_TIME_FLAG_A4W4"] = "3"
            """
        ),
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2, errors=2)
    for test in ("test_sets_it", "test_imports_another_and_sets_it"):
        result.stdout.fnmatch_lines([f"*[[]global-state[]] {test} *IMPORT_TIME_FLAG_A4W4*"])


MONITORED = textwrap.dedent(
    """
    import atexit, threading

    class Monitor(threading.Thread):
        def __init__(self, bar_class):
            super().__init__(daemon=True, name="bar-monitor")
            self.bar_class = bar_class
            self.killed = threading.Event()
            atexit.register(self.exit)
            self.start()

        def run(self):
            self.killed.wait()

        def exit(self):
            self.killed.set()
            if self is not threading.current_thread():
                self.join()

    class Bar:
        monitor = None
        _instances = set()

        def __init__(self):
            cls = type(self)
            if cls.monitor is None:
                Bar.monitor = Monitor(cls)
            cls._instances.add(self)

        def close(self):
            Bar._instances.discard(self)
            if not Bar._instances and Bar.monitor is not None:
                Bar.monitor.exit()
                Bar.monitor = None
    """
)


def test_a_singletons_atexit_registration_is_not_the_tests(pytester: pytest.Pytester) -> None:
    """tqdm's shape: a monitor thread kept in a class attribute registers its own exit with
    atexit. Neither while the class attribute holds it (listed as long-lived) nor once the
    library released it (its last bar closed) is the registration the test's."""
    pytester.makepyfile(
        barlib=MONITORED,
        test_bars=textwrap.dedent(
            """
            import barlib

            def test_closes_its_bar():
                barlib.Bar().close()

            def test_keeps_a_bar_open():
                barlib.Bar()
            """
        ),
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2)
    assert "atexit-holds-object" not in result.stdout.str()
    owners = {(r["kind"], r["owner"]["name"]) for r in _report(pytester)["long_lived"]}
    assert ("atexit", "barlib.Bar.monitor") in owners


def test_an_object_the_test_made_that_only_atexit_holds_is_reported(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        barlib=MONITORED,
        test_monitor=textwrap.dedent(
            """
            import barlib

            def test_makes_its_own_monitor():
                monitor = barlib.Monitor(barlib.Bar)
                monitor.exit()
            """
        ),
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*atexit-holds-object*barlib.Monitor.exit*"])
