"""``pytest_shutdown.checks`` of 0.2.0 still imports for one release (issue 47): each of its
modules is the same object as under ``pytest_shutdown.helpers``, with a DeprecationWarning."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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


def test_a_module_that_never_existed_is_still_an_import_error() -> None:
    done = _run(
        """
        try:
            import pytest_shutdown.checks.no_such_module
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit("imported")
        """
    )
    assert done.returncode == 0, done.stderr
