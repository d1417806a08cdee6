"""Moved modules keep their old paths for one release (issue 47, ``pytest_shutdown._base.moved``):
``pytest_shutdown.checks.*`` of 0.2.0 (now ``helpers``) and the plugin's modules of 0.3.0's package
root (now ``pytest_shutdown.plugin.*``). Each old path is the same module object as the new one,
with a DeprecationWarning naming the new path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_old_module_path_is_the_new_module_with_a_warning() -> None:
    done = _run(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from pytest_shutdown.checks.leaks import no_leaks
            import pytest_shutdown.checks.idempotence as old
        import pytest_shutdown.helpers.idempotence as new
        import pytest_shutdown.helpers.leaks as leaks
        assert old is new and no_leaks is leaks.no_leaks
        assert new.__spec__.name == "pytest_shutdown.helpers.idempotence", new.__spec__
        texts = [str(w.message) for w in caught if w.category is DeprecationWarning]
        assert any("checks.leaks moved to pytest_shutdown.helpers.leaks" in t for t in texts), texts
        """
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package", ["pytest_shutdown.checks", "pytest_shutdown"])
def test_a_module_that_never_existed_is_still_an_import_error(package: str) -> None:
    done = _run(
        f"""
        try:
            import {package}.no_such_module
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("imported")
        """
    )
    assert done.returncode == 0, done.stderr


def test_a_plugin_module_of_the_package_root_is_its_new_module_with_a_warning() -> None:
    done = _run(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import pytest_shutdown.report as old_report
            from pytest_shutdown.guard_ledger import FixtureLedger
            from pytest_shutdown.fixtures import ShutdownCheck
        import pytest_shutdown.plugin.guard.ledger as ledger
        import pytest_shutdown.plugin.report as report
        import pytest_shutdown.plugin.fixtures as fixtures
        assert old_report is report and FixtureLedger is ledger.FixtureLedger
        assert ShutdownCheck is fixtures.ShutdownCheck
        assert report.__spec__.name == "pytest_shutdown.plugin.report", report.__spec__
        texts = [str(w.message) for w in caught if w.category is DeprecationWarning]
        wanted = "pytest_shutdown.guard_ledger moved to pytest_shutdown.plugin.guard.ledger"
        assert any(wanted in t for t in texts), texts
        """
    )
    assert done.returncode == 0, done.stderr


def test_the_entry_point_and_the_public_modules_import_without_a_warning() -> None:
    done = _run(
        """
        import pytest_shutdown.plugin, pytest_shutdown.plugin.guard, pytest_shutdown.devices
        import pytest_shutdown.orphans, pytest_shutdown.harness, pytest_shutdown.aio
        assert callable(pytest_shutdown.plugin.pytest_configure)
        """
    )
    assert done.returncode == 0, done.stderr


def test_the_old_records_command_still_runs(tmp_path: Path) -> None:
    """A report written by 0.3.0 tells its reader to run ``python -m pytest_shutdown.records``."""
    log = tmp_path / "r.records.jsonl"
    log.write_text('{"event": "session", "pytest_shutdown_version": "0.3.0"}\n')
    done = subprocess.run(
        [sys.executable, "-W", "always", "-m", "pytest_shutdown.records", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "moved to pytest_shutdown.plugin.records" in done.stderr
    assert done.stdout.lstrip().startswith("{"), done.stdout
