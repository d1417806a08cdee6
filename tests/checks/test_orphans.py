"""kill_tree_at / assert_tree_dies on real process trees, real signals: both sides of each code.

Every tree is started by one module-wide TreeLauncher (warm), killed at a phase, and watched
until it is gone; whatever is left is reported, then killed by the helper. The test then checks
that nothing of the tree is still running.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import tree_subjects as subjects

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.helpers.orphans import TreeDeath, assert_tree_dies, kill_tree_at
from pytest_shutdown.helpers.tree import scan_tree
from pytest_shutdown.helpers.tree_launcher import TreeLauncher

#: Generous: a correct tree dies in well under a second, but the machine is shared.
DEADLINE_S = 10.0
#: For trees that are expected to leave something behind (the check waits all of it).
SHORT_DEADLINE_S = 3.0


@pytest.fixture(scope="module")
def launcher() -> Iterator[TreeLauncher]:
    with TreeLauncher() as started:
        yield started


def kill_expecting_leftovers(
    launcher: TreeLauncher, target: Any, signal: str, **options: Any
) -> TreeDeath:
    """``kill_tree_at`` on the module's launcher, for a tree expected to leave something behind
    (the short deadline: the check waits all of it)."""
    return kill_tree_at(
        target, signal=signal, deadline_s=SHORT_DEADLINE_S, launcher=launcher, **options
    )


def nothing_left(launcher: TreeLauncher) -> bool:
    return not [p for p in scan_tree(launcher.token, launcher.pid).values() if p.alive]


def test_a_tree_whose_children_watch_their_parent_dies_with_its_root(
    launcher: TreeLauncher,
) -> None:
    record = assert_tree_dies(
        subjects.lifelined_tree, signal="SIGKILL", deadline_s=DEADLINE_S, launcher=launcher
    )
    assert record.died and record.root_exitcode == -9
    assert record.processes_at_signal == 3  # the root and its two children
    assert nothing_left(launcher)


def test_a_child_that_ignores_its_parents_death_is_an_orphan(launcher: TreeLauncher) -> None:
    record = kill_expecting_leftovers(launcher, subjects.child_without_lifeline, "SIGKILL")
    assert [f.code for f in record.findings] == ["orphan-process"]
    details = record.findings[0].details
    assert details["name"] == "deaf_child"
    assert details["parent_at_signal"] == record.root_pid
    assert details["parent_at_end"] == launcher.pid  # re-parented to the subreaper
    assert details["age_s"] is not None and details["age_s"] >= 0
    assert "tree_launcher" in details["cmdline"]
    assert "in child_without_lifeline" in details["stacks"]  # where it is stuck
    assert nothing_left(launcher)  # reported, then killed


@pytest.mark.parametrize("scrub_env", [False, True], ids=["forked", "exec-with-empty-env"])
def test_a_grandchild_that_double_forks_away_is_still_found(
    launcher: TreeLauncher, scrub_env: bool
) -> None:
    with pytest.raises(ShutdownContractError) as caught:
        assert_tree_dies(
            subjects.double_forking_tree, kwargs={"scrub_env": scrub_env}, signal="SIGTERM",
            deadline_s=SHORT_DEADLINE_S, launcher=launcher,
        )
    (finding,) = caught.value.findings
    assert finding.code == "orphan-process"
    assert finding.details["name"] == ("sleep" if scrub_env else "escapee")
    assert finding.details["parent_at_end"] == launcher.pid
    assert nothing_left(launcher)


def test_a_non_daemon_thread_at_exit_is_an_exit_hang_with_its_stack(
    launcher: TreeLauncher,
) -> None:
    record = kill_expecting_leftovers(launcher, subjects.non_daemon_thread_at_exit, "SIGTERM")
    assert [f.code for f in record.findings] == ["exit-hang"]
    details = record.findings[0].details
    assert "non-daemon thread" in details["blocked_in"]
    assert "_block_forever" in details["stacks"]
    assert nothing_left(launcher)


def test_an_untimed_join_of_a_child_at_exit_is_an_exit_hang(launcher: TreeLauncher) -> None:
    record = kill_expecting_leftovers(launcher, subjects.untimed_join_at_exit, "SIGTERM")
    assert [f.code for f in record.findings] == ["exit-hang", "orphan-process"]
    assert "joining a child process" in record.findings[0].details["blocked_in"]
    assert record.findings[1].details["name"] == "joined_child"
    assert nothing_left(launcher)


def test_a_descendant_stuck_in_its_exit_is_an_exit_hang_too(launcher: TreeLauncher) -> None:
    record = kill_expecting_leftovers(launcher, subjects.child_stuck_at_exit, "SIGKILL")
    assert [f.code for f in record.findings] == ["exit-hang"]
    details = record.findings[0].details
    assert details["name"] == "stuck_child" and details["pid"] != record.root_pid
    assert "non-daemon thread" in details["blocked_in"]
    assert nothing_left(launcher)


def test_a_command_line_target_that_dies_whole_passes(launcher: TreeLauncher) -> None:
    script = "import sys, time; sys.stderr.write('serving\\n'); sys.stderr.flush(); time.sleep(60)"
    record = assert_tree_dies(
        [sys.executable, "-c", script], signal="SIGTERM", phases={"ready": r"^serving$"},
        deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert record.root_exitcode == -15


def test_a_shell_launcher_leaving_its_background_job_is_caught(launcher: TreeLauncher) -> None:
    command = ["bash", "-c", "sleep 60 & echo '[pytest-shutdown] phase: ready' >&2; wait"]
    record = kill_expecting_leftovers(launcher, command, "SIGKILL")
    assert [(f.code, f.details["name"]) for f in record.findings] == [("orphan-process", "sleep")]
    assert nothing_left(launcher)


def test_a_phase_can_be_any_line_of_the_trees_output(launcher: TreeLauncher) -> None:
    record = kill_tree_at(
        subjects.phases_in_order, phase="loaded", phases={"loaded": r"^model weights loaded$"},
        signal="SIGTERM", deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert record.died
    assert "model weights loaded" in record.log_tail


def test_killing_one_child_of_a_correct_tree_leaves_the_root_running_until_the_deadline(
    launcher: TreeLauncher,
) -> None:
    # The root of lifelined_tree does not watch its children: killing one leaves the root
    # running, which the helper reports (the root must end when part of its tree dies).
    record = kill_expecting_leftovers(
        launcher, subjects.lifelined_tree, "SIGKILL", level="child", levels={"child": "tree_child*"}
    )
    # the first child by name, among those named when the phase came (the other may still be
    # taking its name on a busy machine): the other one is the orphan
    children = {"tree_child0", "tree_child1"}
    assert record.victim_name in children
    assert [f.code for f in record.findings] == ["exit-hang", "orphan-process"]
    assert record.findings[1].details["name"] == (children - {record.victim_name}).pop()
    assert nothing_left(launcher)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("level", "gpu", "level: unknown level 'gpu'; accepted: root"),
        ("signal", "SIGFOO", "signal: unknown signal 'SIGFOO'; accepted: SIGKILL"),
        ("deadline_s", 0, "deadline_s: expected a finite number of seconds > 0"),
        ("deadline_s", float("inf"), "deadline_s: expected a finite number of seconds > 0"),
        ("phase_timeout_s", "1", "phase_timeout_s: expected a finite number of seconds > 0"),
        ("phase_timeout_s", True, "phase_timeout_s: expected a finite number of seconds > 0"),
        ("phase", "", "phase: expected a phase name"),
    ],
)
def test_bad_input_names_the_option(option: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        kill_tree_at(subjects.lifelined_tree, **{option: value})  # type: ignore[arg-type]


def test_an_empty_command_is_refused() -> None:
    with pytest.raises(ValueError, match="target: expected a callable or a non-empty command"):
        kill_tree_at([])


def test_a_phase_never_reached_fails_with_the_trees_output(launcher: TreeLauncher) -> None:
    with pytest.raises(TimeoutError, match=r"phase 'busy'.*phase_timeout_s=1"):
        kill_tree_at(
            subjects.lifelined_tree, phase="busy", phase_timeout_s=1, launcher=launcher
        )
    assert nothing_left(launcher)
