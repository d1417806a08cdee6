"""The guard reports a process group a test left initialised (``process-group-left``)."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch.distributed", reason="process groups need torch")

SUITE = textwrap.dedent(
    """
    import torch.distributed as dist

    def _init():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def test_destroys_its_group():
        _init()
        dist.destroy_process_group()

    def test_leaves_its_group():
        _init()

    def test_after_the_leaky_one():
        assert dist.is_initialized()  # still there: reported once, by the test that left it
    """
)


def test_the_guard_fails_the_test_that_left_a_group_and_only_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_groups=SUITE)
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-grace=0.2", "-p",
                                           "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines([
        "test_groups.py::test_leaves_its_group: [[]process-group-left[]] the default process*",
        "ERROR test_groups.py::test_leaves_its_group - shutdown guard: *",
    ])
    out = result.stdout.str()
    assert "the default process group" in out and "destroy_process_group()" in out
    assert "test_destroys_its_group - shutdown guard" not in out
    # init_process_group's own sys.excepthook is torch's, for the process: never global-state
    assert "global-state" not in out


def test_without_the_guard_a_left_group_changes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_groups=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3)
