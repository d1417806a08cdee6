"""``process-group-left``: process groups still initialised after a test or a shutdown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from inner_runs import fresh_python

from pytest_shutdown import ShutdownContractError, assert_process_group_destroyed
from pytest_shutdown.harness import process_groups
from pytest_shutdown.helpers.process_groups import group_names, process_group_findings

dist = pytest.importorskip("torch.distributed", reason="process groups need torch")


@pytest.fixture
def default_group() -> Iterator[None]:
    """A one-rank gloo default group, destroyed at the end whatever the test did."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_default_group_left_initialised_is_reported(default_group: None) -> None:
    with pytest.raises(ShutdownContractError) as info:
        assert_process_group_destroyed("the engine's shutdown")
    (finding,) = info.value.findings
    assert finding.code == "process-group-left"
    assert "the default process group" in finding.message
    assert "after the engine's shutdown" in finding.message
    assert finding.details["backend"] == "gloo" and finding.details["ranks"] == [0]


def test_a_group_a_test_made_is_reported_beside_the_default(default_group: None) -> None:
    before = group_names()
    sub = dist.new_group([0])
    try:
        findings = process_group_findings("test x", before)
        assert [f.details["default"] for f in findings] == [False]
        assert len(process_groups()) == 2
    finally:
        dist.destroy_process_group(sub)
    assert process_group_findings("test x", before) == []


def test_a_destroyed_group_is_silent() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.destroy_process_group()
    assert_process_group_destroyed()
    assert process_groups() == []


def test_without_torch_distributed_nothing_is_imported_and_nothing_is_left() -> None:
    code = (
        "import sys\n"
        "from pytest_shutdown import assert_process_group_destroyed, process_groups\n"
        "assert_process_group_destroyed()\n"
        "assert process_groups() == []\n"
        "print('torch' in sys.modules)\n"
    )
    assert fresh_python(code).strip() == "False"
