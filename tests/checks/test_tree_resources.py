"""kill_tree_at reports the segments and socket files a killed tree leaves: both sides."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import tree_resource_subjects as subjects

from pytest_shutdown.helpers.orphans import kill_tree_at
from pytest_shutdown.helpers.tree_launcher import TreeLauncher

DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def launcher() -> Iterator[TreeLauncher]:
    with TreeLauncher() as started:
        yield started


def _psd_segments() -> set[str]:
    """The segments segment_child_tree names (not the engine rings other xdist workers' tests
    create and remove meanwhile)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("psd_") and "_child_" in n}


def test_a_dead_childs_segment_left_by_its_parent_is_an_shm_leak(launcher: TreeLauncher) -> None:
    before = _psd_segments()
    record = kill_tree_at(
        subjects.segment_child_tree, args=(False,), level="seg_child*", signal="SIGKILL",
        deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert [f.code for f in record.findings] == ["shm-leak"]
    (segment,) = record.findings[0].details["segments"]
    assert segment["name"].startswith("psd_") and segment["holders"] == []
    assert "no process holds it" in record.findings[0].message
    assert _psd_segments() == before  # the check removed what the tree left


def test_a_parent_that_unlinks_its_dead_childs_segment_leaves_nothing(
    launcher: TreeLauncher,
) -> None:
    before = _psd_segments()
    record = kill_tree_at(
        subjects.segment_child_tree, args=(True,), level="seg_child*", signal="SIGKILL",
        deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert record.died, record.findings
    assert _psd_segments() == before


def test_a_socket_file_left_on_disk_is_a_port_leak(launcher: TreeLauncher, tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "engine.sock")
    record = kill_tree_at(
        subjects.socket_file_tree, args=(path, False), signal="SIGTERM",
        deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert [f.code for f in record.findings] == ["port-leak"]
    assert record.findings[0].details["socket_files"] == [
        {"path": path, "what": f"socket file {path}"}
    ]
    assert not os.path.exists(path)  # removed by the check


def test_a_socket_file_removed_at_shutdown_leaves_nothing(
    launcher: TreeLauncher, tmp_path  # noqa: ANN001
) -> None:
    path = str(tmp_path / "engine.sock")
    record = kill_tree_at(
        subjects.socket_file_tree, args=(path, True), signal="SIGTERM",
        deadline_s=DEADLINE_S, launcher=launcher,
    )
    assert record.died, record.findings
