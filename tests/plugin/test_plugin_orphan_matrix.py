"""The orphan_matrix marker and the kill_tree fixture, in real pytest runs (pytester)."""

from __future__ import annotations

import textwrap

import pytest
from inner_runs import write_marked_test

#: A torch-free tree for a suite: the root and one child; the child has a lifeline or not.
TREE_MODULE = textwrap.dedent(
    """
    import os, signal, time
    from pytest_shutdown._os.phases import report_phase
    from pytest_shutdown.engine.stop_flag import SignalStop

    def tree(child_lifeline=True):
        stop = SignalStop()
        signal.signal(signal.SIGTERM, lambda *a: stop.set())
        root = os.getpid()
        if os.fork() == 0:
            end = time.monotonic() + 60
            while time.monotonic() < end and (not child_lifeline or os.getppid() == root):
                time.sleep(0.02)
            os._exit(0)
        report_phase("ready")
        stop.wait(60)
    """
)


def test_the_marker_parametrizes_orphan_cell_with_readable_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.orphan_matrix(level=["worker", "root"], signal=["SIGKILL", "TERM", 2],
                                   phase="busy")
        def test_cell(orphan_cell):
            assert orphan_cell.phase == "busy"
        """
    )
    result = pytester.runpytest("-v", "-p", "no:randomly")
    result.stdout.fnmatch_lines([
        "*test_cell[[]worker-SIGKILL-busy[]] PASSED*",
        "*test_cell[[]worker-SIGTERM-busy[]] PASSED*",
        "*test_cell[[]worker-SIGINT-busy[]] PASSED*",
        "*test_cell[[]root-SIGKILL-busy[]] PASSED*",
    ])
    result.assert_outcomes(passed=6)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('signal=["SIGFOO"]', "orphan_matrix: signal: unknown signal 'SIGFOO'; accepted: SIGKILL"),
        ('levels=["x"]', "orphan_matrix: unknown argument(s) levels; accepted: level, signal"),
        ("phase=[]", "orphan_matrix: phase= is empty"),
        ('"root"', "orphan_matrix: takes keyword arguments only"),
    ],
)
def test_bad_marker_arguments_fail_collection_naming_them(
    pytester: pytest.Pytester, arguments: str, message: str
) -> None:
    write_marked_test(pytester, f"orphan_matrix({arguments})", "test_cell(orphan_cell)")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines([f"*{message}*"])
    assert result.ret != 0


def test_orphan_cell_without_the_marker_says_what_is_missing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_cell(orphan_cell):\n    pass\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*the orphan_cell fixture needs @pytest.mark.orphan_matrix*"])
    result.assert_outcomes(errors=1)


def test_kill_tree_passes_a_correct_tree_and_fails_an_orphan_with_its_code(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(subject_tree=TREE_MODULE)
    pytester.makepyfile(
        """
        import pytest
        from subject_tree import tree

        @pytest.mark.orphan_matrix(level=["root"], signal=["SIGKILL", "SIGTERM"])
        def test_correct(kill_tree):
            assert kill_tree(tree).died

        @pytest.mark.orphan_matrix(level=["root"], signal=["SIGKILL"])
        def test_orphan(kill_tree):
            kill_tree(tree, kwargs={"child_lifeline": False}, deadline_s=1.0)
        """
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:randomly", "-p", "shutdown")
    result.stdout.fnmatch_lines([
        "*test_correct[[]root-SIGKILL-ready[]] PASSED*",
        "*test_correct[[]root-SIGTERM-ready[]] PASSED*",
        "*test_orphan[[]root-SIGKILL-ready[]] FAILED*",
        "*[[]orphan-process[]] python (pid *) outlived SIGKILL to root*",
    ])
    result.assert_outcomes(passed=2, failed=1)


def test_the_matrix_runs_under_xdist_with_a_launcher_per_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(subject_tree=TREE_MODULE)
    pytester.makepyfile(
        """
        import os
        import pytest
        from subject_tree import tree

        @pytest.mark.orphan_matrix(level=["root"], signal=["SIGKILL", "SIGTERM", "SIGINT"],
                                   phase=["ready"])
        def test_cell(kill_tree, tree_launcher, orphan_cell):
            assert kill_tree(tree).died
            with open(f"launcher-{os.environ['PYTEST_XDIST_WORKER']}", "a") as f:
                f.write(f"{tree_launcher.pid}\\n")
        """
    )
    result = pytester.runpytest_subprocess("-n", "2", "-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(passed=3)
    launchers = {
        path.name: set(path.read_text().split()) for path in pytester.path.glob("launcher-gw*")
    }
    assert all(len(pids) == 1 for pids in launchers.values()), launchers
    if len(launchers) == 2:  # both workers ran a cell: each had a launcher of its own
        assert launchers["launcher-gw0"] != launchers["launcher-gw1"]
