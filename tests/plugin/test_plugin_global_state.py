"""global-state: process-wide state a test changed and did not put back."""

from __future__ import annotations

import textwrap

import pytest

SUITE = textwrap.dedent(
    """
    import gc, multiprocessing, os, signal, sys, threading
    import pytest

    os.environ["PRESET_VAR"] = "kept"  # at import: part of every test's baseline

    def handler(signum, frame):
        pass

    def test_gc_disabled():
        gc.disable()

    def test_gc_enabled_again():
        assert gc.isenabled()

    def test_gc_thresholds():
        gc.set_threshold(1, 1, 1)

    def test_gc_thresholds_back():
        assert gc.get_threshold() != (1, 1, 1)

    def test_signal_replaced():
        signal.signal(signal.SIGUSR1, handler)

    def test_signal_back():
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL

    def test_signal_ignored():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def test_start_method_forced():
        multiprocessing.set_start_method("spawn", force=True)

    def test_start_method_decided_lazily():
        multiprocessing.get_start_method()  # the default, decided on first use: not a change

    def test_excepthook():
        sys.excepthook = lambda *args: None

    def test_threading_excepthook():
        threading.excepthook = lambda args: None

    def test_environ_added():
        os.environ["LEAKED_VAR"] = "1"

    def test_environ_changed():
        os.environ["PRESET_VAR"] = "changed"

    def test_environ_removed():
        del os.environ["PRESET_VAR"]

    def test_environ_back():
        assert os.environ.get("PRESET_VAR") == "kept" and "LEAKED_VAR" not in os.environ

    def test_clean_restores_what_it_changes(monkeypatch):
        monkeypatch.setenv("TEMP_VAR", "1")
        old = signal.signal(signal.SIGUSR2, handler)
        signal.signal(signal.SIGUSR2, old)
        gc.disable()
        gc.enable()

    @pytest.fixture(scope="module")
    def tidy_service():
        os.environ["SERVICE_URL"] = "http://127.0.0.1:1"
        yield
        del os.environ["SERVICE_URL"]

    @pytest.fixture(scope="module")
    def untidy_service():
        signal.signal(signal.SIGUSR2, handler)
        yield

    def test_uses_tidy_service(tidy_service):
        assert os.environ["SERVICE_URL"]

    def test_uses_untidy_service(untidy_service):
        pass

    def test_last():
        pass
    """
)

LEAKY = {
    "test_gc_disabled": "gc: disabled (was enabled)",
    "test_gc_thresholds": "gc thresholds: (1, 1, 1) (was (*))",
    "test_signal_replaced": "signal handler SIGUSR1: test_state.handler (was SIG_DFL (default))",
    "test_signal_ignored": "signal handler SIGHUP: SIG_IGN (ignored) (was SIG_DFL (default))",
    "test_start_method_forced": "multiprocessing start method: spawn (was not set (default *))",
    "test_excepthook": "sys.excepthook: test_state.test_excepthook.<locals>.<lambda> (was *)",
    "test_threading_excepthook": "threading.excepthook: test_state.*<lambda> (was *)",
    "test_environ_added": "os.environ['LEAKED_VAR']: '1' (was unset)",
    "test_environ_changed": "os.environ['PRESET_VAR']: 'changed' (was 'kept')",
    "test_environ_removed": "os.environ['PRESET_VAR']: unset (was 'kept')",
}


def test_every_global_state_change_is_found_and_undone_in_fail_mode(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_state=SUITE)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", "-v")
    # each leaky test errors in teardown; the next one finds the process clean again; the
    # untidy module fixture is blamed at its teardown (with the module's last test)
    result.assert_outcomes(passed=19, errors=len(LEAKY) + 1)
    out = result.stdout.str()
    for test, change in LEAKY.items():
        result.stdout.fnmatch_lines([f"*::{test}: ?global-state? {test} left process-wide state *"])
        result.stdout.fnmatch_lines([f"*{change}*".replace("[", "?").replace("]", "?")])
        assert f"ERROR test_state.py::{test} -" in out
    result.stdout.fnmatch_lines(
        [
            "test_state.py::test_last: ?global-state? fixture 'untidy_service' (module scope) "
            "left process-wide state changed: signal handler SIGUSR2: test_state.handler*"
        ]
    )
    for clean in (
        "test_start_method_decided_lazily",
        "test_clean_restores_what_it_changes",
        "test_uses_tidy_service",
        "test_uses_untidy_service",
    ):
        result.stdout.fnmatch_lines([f"test_state.py::{clean} PASSED*"])
        assert f"{clean}: [global-state]" not in out


def test_warn_mode_reports_and_changes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_state=textwrap.dedent(
            """
            import gc

            def test_gc_disabled():
                gc.disable()

            def test_still_disabled():
                assert not gc.isenabled()
                gc.enable()
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*global-state* test_gc_disabled left process-wide state*"])


def test_allow_leaks_global_state_silences_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_state=textwrap.dedent(
            """
            import gc, pytest

            @pytest.mark.allow_leaks(global_state=True, reason="configures gc for the suite")
            def test_tunes_gc():
                gc.set_threshold(10_000, 50, 50)
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=1)


def test_a_tests_change_is_never_blamed_on_a_fixture_alive_around_it(
    pytester: pytest.Pytester,
) -> None:
    """Warn mode leaves the test's change in place until the session fixture's teardown: the
    fixture is not blamed for it (only what its own set-up or teardown changed is its)."""
    pytester.makepyfile(
        test_state=textwrap.dedent(
            """
            import os, pytest

            @pytest.fixture(scope="session")
            def service():
                yield "up"

            def test_changes_environ(service):
                os.environ["SET_BY_TEST"] = "1"

            def test_last(service):
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*test_changes_environ: ?global-state? test_changes_environ *"])
    assert "fixture 'service'" not in result.stdout.str()


def test_a_new_handler_that_reads_as_the_old_one_says_it_is_a_new_one(
    pytester: pytest.Pytester,
) -> None:
    """pyzmq's suite: each test's set-up installs a fresh ``functools.partial`` of the same
    method as the SIGALRM handler; "X (was X)" read as no change at all."""
    pytester.makepyfile(
        """
        import functools, signal

        def on_alarm(tag, signum, frame):
            pass

        def test_installs_a_partial():
            signal.signal(signal.SIGALRM, functools.partial(on_alarm, "a"))

        def test_installs_another_partial():
            signal.signal(signal.SIGALRM, functools.partial(on_alarm, "b"))
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "a new one (the one before reads the same)" in out
    assert out.count("(was ") >= 1  # the first test's change still names what was there
