"""vLLM #51579: a SIGKILLed worker's shared-memory ring buffer stays in /dev/shm for good.

vLLM moves outputs through a ring buffer in a POSIX shared-memory segment (``MessageQueue``).
The process that created it unlinks it when it shuts down; a SIGKILLed one never does, and its
parent did not either: every kill left a 4 MiB+ segment in ``/dev/shm`` until the host filled up
(SGLang ships ``stale_shm_cleanup.py`` for the same reason). Fixed by the surviving parent
unlinking what its dead child created: the reference EngineProcManager names each EngineCore's
ring and unlinks it however the EngineCore ended. ``ChildFaults(parent_unlinks_ring=False)``
puts the bug back.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.engine import REFERENCE_LEVELS, ChildFaults, serve_frontend

CELL = {"level": "engine_core", "signal": "SIGKILL", "phase": "busy"}


def expect(code: str, error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong code fails the xfail test."""
    assert set(error.codes) == {code}, error.codes
    (segment,) = error.findings[0].details["segments"]
    assert segment["name"].startswith("psd_") and segment["holders"] == []
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="the segment stays")
def test_a_killed_engine_cores_ring_is_never_unlinked(kill_tree: Any) -> None:
    try:
        kill_tree(serve_frontend, kwargs={"faults": ChildFaults(parent_unlinks_ring=False)},
                  levels=REFERENCE_LEVELS, **CELL)
    except ShutdownContractError as error:
        expect("shm-leak", error)


def test_the_parent_unlinks_a_killed_engine_cores_ring(kill_tree: Any) -> None:
    kill_tree(serve_frontend, levels=REFERENCE_LEVELS, **CELL)
