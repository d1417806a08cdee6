"""vLLM PR #38779 / vllm-rbln PR #639: interpreter exit blocks forever on what nobody stopped.

The frontend shut its engines down and returned, but a non-daemon output thread nobody stopped
still blocked on its queue with no timeout; the interpreter's exit joins every non-daemon thread
(without a timeout), so the process never ended. Fixed: the loop that handles outputs is the
frontend's own, with a deadline; nothing non-daemon is left behind at exit.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import REFERENCE_LEVELS, serve_frontend

DEADLINE_S = 5.0
CELL = {"level": "frontend", "signal": "SIGTERM", "phase": "ready"}


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert error.codes == [code], error.codes
    (hang,) = error.findings
    assert "non-daemon thread" in hang.details["blocked_in"]
    assert "_handle_outputs_forever" in hang.details["stacks"]
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="exit waits forever")
def test_a_non_daemon_thread_nobody_stops_hangs_the_exit(kill_tree: Any) -> None:
    try:
        kill_tree(serve_frontend, kwargs={"exit_hang_bug": True}, levels=REFERENCE_LEVELS,
                  deadline_s=DEADLINE_S, **CELL)
    except ShutdownContractError as error:
        expect("exit-hang", error)


def test_a_frontend_that_owns_its_output_loop_exits(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, **CELL)
