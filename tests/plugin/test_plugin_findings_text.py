"""What the terminal shows of findings, in real pytest runs (pytester).

* ``-vv`` and ``--shutdown-details`` show every fact of a finding (what the JSON report has);
* the ``shutdown`` section's title is coloured as pytest colours its own sections;
* a failed test's guard block is printed once;
* an orphan_matrix phase that can never match fails at collection, and a phase the tree never
  reports fails the cell within seconds, naming the phases it did report.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest

RAISES_WITH_DETAILS = textwrap.dedent(
    """
    from pytest_shutdown import Finding, ShutdownContractError

    def test_leaks():
        raise ShutdownContractError([Finding(
            "process-leak", "worker 4242 still running after shutdown.",
            {"pid": 4242, "cmdline": ["python", "-m", "worker"], "owner": "engine.pool",
             "stack": "line one\\nline two"},
        )])
    """
)


@pytest.mark.parametrize("flag", ["-vv", "--shutdown-details"])
def test_details_show_every_fact_of_a_finding(pytester: pytest.Pytester, flag: str) -> None:
    pytester.makepyfile(test_details=RAISES_WITH_DETAILS)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-report=r.json", "-p", "no:randomly", flag
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # the failure's own section and the summary both list every fact
    assert "- shutdown finding details -" in out
    for fact in ("    pid: 4242", '    cmdline: ["python", "-m", "worker"]',
                 "    owner: engine.pool", "    stack:", "      line one", "      line two"):
        assert out.count(fact) >= 2, (fact, out)
    report = json.loads((pytester.path / "r.json").read_text())
    (finding,) = report["tests"][0]["findings"]
    assert set(finding["details"]) == {"pid", "cmdline", "owner", "stack"}


def test_without_details_only_the_message_is_shown(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_details=RAISES_WITH_DETAILS)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "[process-leak] worker 4242 still running after shutdown." in out
    assert "shutdown finding details" not in out and "owner: engine.pool" not in out


LEAKS_A_THREAD = textwrap.dedent(
    """
    import threading

    stop = threading.Event()

    def test_leaks():
        threading.Thread(target=stop.wait, args=(30,), name="leaky", daemon=True).start()

    def test_zz_stop():
        # (does not stop 'leaky': warn mode confirms it once its grace ran out, at session
        # end here; stopped now it would have ended within its grace, not a leak)
        pass
    """
)


@pytest.mark.parametrize(
    ("body", "extra", "colour"),
    [
        (RAISES_WITH_DETAILS, [], "\x1b[31m"),
        (LEAKS_A_THREAD, ["--shutdown-guard=warn", "--shutdown-grace=0.2"], "\x1b[33m"),
        ("def test_ok():\n    pass\n", [], "\x1b[32m"),
    ],
    ids=["failed-red", "warned-yellow", "none-green"],
)
def test_the_shutdown_section_is_coloured_like_pytests_own(
    pytester: pytest.Pytester, body: str, extra: list[str], colour: str
) -> None:
    pytester.makepyfile(test_colour=body)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--color=yes", *extra
    )
    (title,) = [line for line in result.stdout.lines if " shutdown " in line and "====" in line]
    assert colour in title, repr(title)

    plain = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", "--color=no")
    (title,) = [line for line in plain.stdout.lines if " shutdown " in line and "====" in line]
    assert "\x1b[" not in title


FAILING_WITH_A_THREAD = textwrap.dedent(
    """
    import threading

    def test_fails_with_a_thread_alive():
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="alive-at-failure", daemon=True).start()
        assert 1 == 2
    """
)


@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_the_guard_block_of_a_failed_test_is_printed_once(
    pytester: pytest.Pytester, extra: list[str]
) -> None:
    pytester.makepyfile(test_failing=FAILING_WITH_A_THREAD)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=60", "-p", "no:randomly", *extra
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert out.count("Captured shutdown guard teardown") == 1, out
    assert out.count("'alive-at-failure' (target threading.Event.wait, started by") >= 1


def test_a_phase_that_can_never_match_fails_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.orphan_matrix(phase=["ready", " busy"])
        def test_cell(orphan_cell):
            pass
        """
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*orphan_matrix: phase= ' busy' can never match*"])
    assert result.ret != 0


TREE = textwrap.dedent(
    """
    import signal
    from pytest_shutdown._os.phases import report_phase
    from pytest_shutdown.engine.stop_flag import SignalStop

    def tree():
        stop = SignalStop()
        signal.signal(signal.SIGTERM, lambda *a: stop.set())
        report_phase("starting")
        report_phase("ready")
        stop.wait(60)
    """
)


def test_a_phase_the_tree_never_reports_fails_the_cell_within_seconds(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(subject_tree=TREE)
    pytester.makepyfile(
        """
        import pytest
        from subject_tree import tree

        @pytest.mark.orphan_matrix(level=["root"], signal=["SIGKILL"], phase=["redy"])
        def test_cell(kill_tree):
            kill_tree(tree)
        """
    )
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    assert time.monotonic() - started < 45  # the phase timeout alone is 60 s
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*phase: the tree never reported phase 'redy' (did you mean 'ready'?); reported so far: "
        "starting, ready*"
    ])
