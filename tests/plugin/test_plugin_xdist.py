"""The guard under pytest-xdist: findings travel through workeroutput to the controller."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("xdist")

PER_WORKER = textwrap.dedent(
    """
    import os, threading

    WORKER = os.environ.get("PYTEST_XDIST_WORKER", "none")

    def test_leaks_a_thread_named_after_its_worker():
        threading.Thread(
            target=threading.Event().wait, name=f"leak-{WORKER}", daemon=True
        ).start()

    def test_clean():
        pass
    """
)


#: Every test on each of two xdist workers, with a report.
EACH_ON_TWO_WORKERS = (
    "-p",
    "shutdown",
    "-n",
    "2",
    "--dist=each",
    "--shutdown-grace=0.3",
    "--shutdown-report=r.json",
)


def test_leaks_in_both_workers_reach_the_controller(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_workers=PER_WORKER)
    result = pytester.runpytest_subprocess(*EACH_ON_TWO_WORKERS, "-v")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*= shutdown =*",
            "2 of 4 tests with findings (thread-leak: 2) (guard in fail mode, grace 0.3 s)",
            "test_workers.py::test_leaks_a_thread_named_after_its_worker [[]gw0]: "
            "[[]thread-leak]*'leak-gw0'*",
            "test_workers.py::test_leaks_a_thread_named_after_its_worker [[]gw1]: "
            "[[]thread-leak]*'leak-gw1'*",
            "shutdown durations: median * s, max * s over 4 tests",
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["workers"] == ["gw0", "gw1"]
    assert report["lost_workers"] == []
    assert sorted(t["worker"] for t in report["tests"]) == ["gw0", "gw1"]
    names = sorted(t["findings"][0]["details"]["threads"][0]["name"] for t in report["tests"])
    assert names == ["leak-gw0", "leak-gw1"]
    assert report["durations"]["count"] == 4


def test_a_crashed_worker_loses_only_the_test_it_was_running(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_crash=PER_WORKER
        + textwrap.dedent(
            """
            def test_zz_crash_on_gw1():
                if WORKER == "gw1":
                    os._exit(3)
            """
        )
    )
    result = pytester.runpytest_subprocess(*EACH_ON_TWO_WORKERS)
    assert result.ret != 0
    report = json.loads((pytester.path / "r.json").read_text())
    # Both leaks are kept: gw1's finding reached the controller with the test's teardown report,
    # before gw1 died in a later test; gw1 is listed as lost.
    assert sorted(t["worker"] for t in report["tests"]) == ["gw0", "gw1"]
    assert [lost["worker"] for lost in report["lost_workers"]] == ["gw1"]
    # A worker that ended before its session did: the report is not complete (issue 23).
    assert report["complete"] is False and "gw1" in report["incomplete"]
    result.stdout.fnmatch_lines(
        ["worker gw1 crashed: the records of the tests it finished are kept, the test it was *"]
    )


def test_bad_marker_under_xdist_is_the_same_collection_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.allow_leaks(threads=True)
        def test_no_reason():
            pass

        def test_fine():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "-n", "2")
    assert result.ret != pytest.ExitCode.OK  # xdist reports collection errors as failures
    result.stdout.fnmatch_lines(["*test_no_reason: @pytest.mark.allow_leaks needs reason=*"])
    assert "INTERNALERROR" not in result.stdout.str()
    assert "1 passed" not in result.stdout.str()
