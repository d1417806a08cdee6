"""Options, ini keys and marker arguments: validated, with errors naming the option and values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

#: A folder that exists and that nobody, root included, may write in (Linux procfs).
READ_ONLY = Path("/proc/sys")
needs_read_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not READ_ONLY.is_dir(), reason="needs Linux /proc/sys"
)


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
        # Too large for the platform's timers: refused with the accepted range.
        (["--shutdown-budget=1e10"], "", ["--shutdown-budget", "seconds >= 0 and <= 86400"]),
        (["--shutdown-grace=1e10"], "", ["--shutdown-grace", "seconds >= 0 and <= 86400"]),
        ([], "shutdown_budget = 90000", ["shutdown_budget (ini)", "<= 86400"]),
        (["--shutdown-platform="], "", ["--shutdown-platform", "'' is not accepted", "auto, cuda"]),
        (["--shutdown-graphs="], "", ["--shutdown-graphs", "folder path"]),
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


@pytest.mark.parametrize(
    ("option", "where", "message"),
    [
        ("--shutdown-report", "a-folder", "is a folder; expected a file path"),
        ("--shutdown-report", "a-file/r.json", "is a file, not a folder"),
        ("--shutdown-report", "a-file/deeper/r.json", "is a file, not a folder"),
        ("--shutdown-graphs", "a-file", "exists and is not a folder"),
        ("--shutdown-graphs", "a-file/graphs", "is a file, not a folder"),
        # /proc and /sys are kernel interfaces: refused up front (issue 23 item 8).
        pytest.param(
            "--shutdown-report", f"{READ_ONLY}/r.json", "a kernel interface", marks=needs_read_only
        ),
        pytest.param(
            "--shutdown-report", f"{READ_ONLY}/missing/r.json", "a kernel interface",
            marks=needs_read_only,
        ),
        pytest.param(
            "--shutdown-report", "/proc/self/r.json", "under /proc, a kernel interface",
            marks=needs_read_only,
        ),
        pytest.param(
            "--shutdown-report", "/sys/kernel/r.json", "under /sys, a kernel interface",
            marks=needs_read_only,
        ),
        pytest.param(
            "--shutdown-graphs", f"{READ_ONLY}/graphs", "a kernel interface",
            marks=needs_read_only,
        ),
    ],
)
def test_a_place_that_cannot_be_written_is_refused_at_start_up(
    pytester: pytest.Pytester, option: str, where: str, message: str
) -> None:
    (pytester.path / "a-folder").mkdir()
    (pytester.path / "a-file").write_text("not a folder")
    pytester.makepyfile("def test_never_runs(): open('ran', 'w').close()")
    result = pytester.runpytest_subprocess("-p", "shutdown", f"{option}={where}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert option in err and message in err, err
    assert not (pytester.path / "ran").exists()


def test_missing_folders_of_the_report_are_created(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_fine(): pass")
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-report=out/deep/r.json")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "out" / "deep" / "r.json").is_file()


def test_valid_options_are_stored_on_the_config(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pytest_shutdown.plugin.settings import SETTINGS_KEY

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
            from pytest_shutdown.plugin.settings import SETTINGS_KEY
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
        ("shutdown_budget(1e10)", "<= 86400"),
        ("expect_force_kill(True)", "keyword arguments only; accepted: reason"),
        ("expect_force_kill(resaon='typo')", "unknown argument(s) resaon; accepted: reason"),
        ("expect_force_kill(reason=1)", "reason= takes a string"),
    ],
)
@pytest.mark.parametrize("guard", ["-p shutdown", "--shutdown-guard=off"])
def test_bad_marker_is_a_collection_error_naming_the_test(
    pytester: pytest.Pytester, marker: str, message: str, guard: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_marked():
            pass

        def test_never_runs():
            open("ran", "w").close()
        """
    )
    result = pytester.runpytest(*guard.split())
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "ERROR collecting" in out and "test_marked" in out and message in out, out
    assert not (pytester.path / "ran").exists()
