"""Creation sites: ``multiprocessing`` is wrapped when it is first imported, not imported."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from inner_runs import fresh_python

SCRIPT = textwrap.dedent(
    """
    import sys
    from pytest_shutdown.ownership import origins

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
    assert fresh_python(SCRIPT).splitlines()[-1] == "ok"


def test_uninstall_before_the_import_leaves_multiprocessing_untouched() -> None:
    script = textwrap.dedent(
        """
        import sys
        from pytest_shutdown.ownership import origins

        origins.install()
        origins.uninstall()
        import multiprocessing.process
        assert multiprocessing.process.BaseProcess.start.__module__ == "multiprocessing.process"
        assert not [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
        print("ok")
        """
    )
    assert fresh_python(script).strip() == "ok"


LIBRARY_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import pytest
    from pytest_shutdown.ownership import origins

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
    assert fresh_python(LIBRARY_SCRIPT).splitlines()[-1] == "ok"


#: A parent that a busy machine does not run again between its child's exec and the return of
#: ``Popen()``: the child (a shell) starts a background job and exits meanwhile. Simulated
#: without load: ``_execute_child`` returns only once the grandchild runs and its start time is
#: well in the past. The grandchild is re-parented; it must still be matched to the ``Popen``.
LATE_PARENT_SCRIPT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pytest_shutdown.ownership import containment
    from pytest_shutdown.ownership import origins

    PIDFILE = sys.argv[1]
    execute_child = subprocess.Popen._execute_child

    def late_parent(self, *args, **kwargs):
        execute_child(self, *args, **kwargs)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the grandchild runs, long enough ago
            try:
                grandchild = int(open(PIDFILE).read())
            except (OSError, ValueError):
                grandchild = None
            started = grandchild and containment._started_at(grandchild)
            if started and time.time() > started + 0.5:
                return
            time.sleep(0.01)
        raise AssertionError("the grandchild never started")

    subprocess.Popen._execute_child = late_parent
    origins.install()
    shell = subprocess.Popen(["sh", "-c", f"sleep 60 & echo $! > {PIDFILE}"])
    grandchild = int(open(PIDFILE).read())
    try:
        shell.wait(30)
        print(containment.first_ancestor(grandchild) == (shell.pid, "started before it"))
    finally:
        os.kill(grandchild, signal.SIGKILL)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc start times")
def test_a_grandchild_started_before_its_parents_popen_returned_is_matched_to_it(
    tmp_path: Path,
) -> None:
    out = fresh_python(LATE_PARENT_SCRIPT, str(tmp_path / "grandchild.pid"), timeout=90)
    assert out.split() == ["True"], "the grandchild was matched to no ancestor"


#: A leaked child no ``Popen``/``Process`` started (a bare ``os.fork``): its record says that
#: where it was started is unknown, and the rendered finding says so too.
BARE_FORK_SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    from pytest_shutdown.ownership import origins
    from pytest_shutdown.plugin.report import render_findings
    from pytest_shutdown.resources.processes import ProcessKind

    origins.install()
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    try:
        (finding,) = ProcessKind().findings([pid], "test_x", grace=0)
        (record,) = finding.details["processes"]
        assert str(record.get("started_at")).startswith("unknown: no Popen"), record
        text = render_findings([finding.to_dict()])
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("    started at (user"))
        assert lines[at + 1].startswith("      unknown: no Popen or multiprocessing start"), text
        assert record.get("what") is None, record  # a fork repeats our command line: not named
        print("ok")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_leaked_process_of_no_recorded_start_says_its_site_is_unknown() -> None:
    assert fresh_python(BARE_FORK_SCRIPT).split() == ["ok"]
