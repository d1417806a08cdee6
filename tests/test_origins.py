"""Creation sites: ``multiprocessing`` is wrapped when it is first imported, not imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    from pytest_shutdown import origins

    origins.install()
    assert "multiprocessing" not in sys.modules, "install imported multiprocessing"
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(target=print, args=("child",))
    process.start()  # line 10: the creation site
    process.join(30)
    origin = origins.origin_of_process(process.pid)
    assert origin is not None, "Process.start was not wrapped on import"
    assert origin.frames[-1][1] == 10, origin
    origins.uninstall()
    assert multiprocessing.process.BaseProcess.start.__module__ == "multiprocessing.process"
    assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
    print("ok")
    """
)


def test_process_start_is_wrapped_when_multiprocessing_is_first_imported() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "ok"


def test_uninstall_before_the_import_leaves_multiprocessing_untouched() -> None:
    script = textwrap.dedent(
        """
        import sys
        from pytest_shutdown import origins

        origins.install()
        origins.uninstall()
        import multiprocessing.process
        assert multiprocessing.process.BaseProcess.start.__module__ == "multiprocessing.process"
        assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


LIBRARY_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import pytest
    from pytest_shutdown import origins

    assert origins._is_library(threading.__file__), "the standard library is the library"
    assert origins._is_library("<frozen runpy>")
    assert not origins._is_library(pytest.__file__), "an installed package is not"
    assert not origins._is_library(origins.__file__.replace("origins.py", "nowhere.py"))
    assert "sysconfig" not in sys.modules, "telling the library apart imported sysconfig"
    print("ok")
    """
)


def test_the_library_is_told_apart_without_importing_sysconfig() -> None:
    """A creation site's frames are sorted into the test's and the standard library's; that
    must not cost the session an import of ``sysconfig`` (10 ms) at its first thread."""
    result = subprocess.run(
        [sys.executable, "-c", LIBRARY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "ok"
