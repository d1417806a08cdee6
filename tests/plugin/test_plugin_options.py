"""Options, ini keys and marker arguments: validated, with errors naming the option and values."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("args", "ini", "names"),
    [
        (["--shutdown-guard=maybe"], "", ["--shutdown-guard", "off, warn, fail"]),
        (["--shutdown-grace=-1"], "", ["--shutdown-grace", "seconds >= 0"]),
        (["--shutdown-grace=nan"], "", ["--shutdown-grace", "seconds >= 0"]),
        (["--shutdown-grace=soon"], "", ["--shutdown-grace", "seconds >= 0"]),
        (["--shutdown-budget=-0.5"], "", ["--shutdown-budget", "seconds >= 0"]),
        (["--shutdown-budget=NaN"], "", ["--shutdown-budget", "seconds >= 0"]),
        (["--shutdown-platform=tpu"], "", ["--shutdown-platform", "auto, cuda, rocm, cpu"]),
        (["--shutdown-report="], "", ["--shutdown-report", "file path"]),
        ([], "shutdown_guard = always", ["shutdown_guard (ini)", "off, warn, fail"]),
        ([], "shutdown_grace = -2", ["shutdown_grace (ini)", "seconds >= 0"]),
        ([], "shutdown_budget = inf", ["shutdown_budget (ini)", "seconds >= 0"]),
    ],
)
def test_bad_option_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, args: list[str], ini: str, names: list[str]
) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_never_runs(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    for name in names:
        assert name in err, err


def test_valid_options_are_stored_on_the_config(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pytest_shutdown.settings import SETTINGS_KEY

        @pytest.fixture
        def settings(pytestconfig):
            return pytestconfig.stash[SETTINGS_KEY]
        """
    )
    pytester.makepyfile(
        """
        def test_settings(settings):
            assert settings.platform == "rocm"
            assert settings.mode == "warn"
            assert settings.grace_s == 0.5 and settings.budget_s == 3.0
        """
    )
    result = pytester.runpytest(
        "--shutdown-platform=rocm",
        "--shutdown-guard=warn",
        "--shutdown-grace=0.5",
        "--shutdown-budget=3",
    )
    result.assert_outcomes(passed=1)


def test_defaults_change_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_plugin_registered_but_no_guard(pytestconfig):
            from pytest_shutdown.settings import SETTINGS_KEY
            settings = pytestconfig.stash[SETTINGS_KEY]
            assert settings.mode == "off" and settings.platform == "auto"
            assert settings.grace_s == 2.0 and settings.budget_s == 0.0
            assert pytestconfig.pluginmanager.get_plugin("pytest-shutdown-guard") is None
            assert pytestconfig.pluginmanager.get_plugin("pytest-shutdown-report") is None
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("allow_leaks(threads=True)", "needs reason="),
        ("allow_leaks(reason='')", "needs reason="),
        ("allow_leaks(thread=True, reason='x')", "unknown argument(s) thread"),
        ("allow_leaks(True, reason='x')", "keyword arguments only"),
        ("allow_leaks(processes='yes', reason='x')", "processes= takes True or False"),
        ("allow_leaks(threads=[1], reason='x')", "thread-name glob patterns"),
        ("shutdown_budget(-1)", "seconds >= 0"),
        ("shutdown_budget('5')", "one number of seconds"),
        ("shutdown_budget()", "one number of seconds"),
        ("shutdown_budget(1, limit=2)", "unknown argument(s) limit"),
    ],
)
def test_bad_marker_is_a_usage_error_at_collection(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_marked():
            pass
        """
    )
    result = pytester.runpytest("-p", "shutdown")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "test_marked" in err and message in err, err
