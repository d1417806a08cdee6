"""The timeout matrix: request-drain timeout x process-cleanup timeout x platform.

Three ways to use it, from the cheapest: check a policy function over every cell at once
(``assert_timeout_decoupling``), parametrize a test with the cells (``timeout_matrix``), or let the
``shutdown_matrix`` marker parametrize the ``shutdown_timeouts`` fixture (and ``engine_config``).
"""

from __future__ import annotations

import pytest

from pytest_shutdown import ShutdownTimeouts, TimeoutCell, assert_timeout_decoupling, timeout_matrix
from pytest_shutdown.engine import EngineConfig, get_engine_process_shutdown_timeout


def test_the_engine_policy_over_the_whole_matrix() -> None:
    assert_timeout_decoupling(get_engine_process_shutdown_timeout, grace=15.0)


@pytest.mark.parametrize("cell", timeout_matrix(grace=15.0).as_params())
def test_each_cell_of_the_matrix(cell: TimeoutCell) -> None:
    got = get_engine_process_shutdown_timeout(
        cell.request_timeout, cell.process_timeout, cell.platform
    )
    assert got == cell.expected


@pytest.mark.shutdown_matrix(request=[0, 5.0], process=[0, None], platform=["rocm"], grace=1.5)
def test_the_marker_feeds_the_engine_config(
    shutdown_timeouts: ShutdownTimeouts, engine_config: EngineConfig
) -> None:
    # engine_config follows the cell: request timeout, platform and grace
    assert engine_config.shutdown_timeout == shutdown_timeouts.request_timeout
    assert engine_config.platform == "rocm" and engine_config.rocm_process_grace_s == 1.5
    got = get_engine_process_shutdown_timeout(
        shutdown_timeouts.request_timeout,
        shutdown_timeouts.process_timeout,
        engine_config.platform,
        rocm_grace_s=engine_config.rocm_process_grace_s,
    )
    assert got == shutdown_timeouts.expected_process_timeout
