"""Model loading that disables the garbage collector for speed and leaves it disabled when a
shard fails to load: every later test (and the server) runs without gc. Fixed: ``try/finally``.
"""

from __future__ import annotations

import gc

import pytest

from pytest_shutdown import ShutdownContractError, no_global_state_changes


def _load_shard(index: int) -> None:
    if index == 2:
        raise OSError("shard 2: checksum mismatch")


def buggy_load(shards: int) -> int:
    gc.disable()  # faster unpickling of many small objects
    try:
        for index in range(shards):
            _load_shard(index)
    except OSError:
        return -1  # the error path forgets gc.enable()
    gc.enable()
    return shards


def fixed_load(shards: int) -> int:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for index in range(shards):
            _load_shard(index)
    except OSError:
        return -1
    finally:
        if was_enabled:
            gc.enable()
    return shards


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="gc left disabled")
def test_buggy_loader_leaves_gc_disabled() -> None:
    try:
        with no_global_state_changes():  # puts gc back before raising
            buggy_load(4)
    except ShutdownContractError as error:
        assert error.codes == ["global-state"], error.codes
        assert "gc: disabled (was enabled)" in str(error)
        raise


def test_fixed_loader_puts_gc_back() -> None:
    with no_global_state_changes():
        assert fixed_load(4) == -1
