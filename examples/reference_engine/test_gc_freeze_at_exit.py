"""The gc.freeze() scenarios of an engine process, observed with ``probe_exit``.

``run_engine_core`` ends a *clean* shutdown on ROCm with ``gc.freeze()``: the process is about to
exit, and freezing skips the slow cyclic GC at interpreter finalization. Anything else (another
platform, a non-zero exit, work left, a positive drain timeout) must leave the freeze count alone.
``probe_exit`` runs the real entry point in a child process and reports how it really ended:
exit code, signal, the gc freeze count after every ``finally``, stderr.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown import probe_exit  # noqa: E402
from pytest_shutdown.engine import (  # noqa: E402
    ChildFaults,
    EngineConfig,
    run_engine_core,
)

# scenario: (config fields, injected faults, expected exit code, heap frozen at the end)
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any], int, bool]] = {
    "clean-rocm-exit-freezes": ({"platform": "rocm"}, {}, 0, True),
    "cuda-never-freezes": ({"platform": "cuda"}, {}, 0, False),
    "non-zero-exit": ({"platform": "rocm"}, {"exit_code": 2}, 2, False),
    "work-left": ({"platform": "rocm"}, {"leave_work": True}, 0, False),
    "drain-timeout": ({"platform": "rocm", "shutdown_timeout": 1.0}, {}, 0, False),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gc_freeze_only_after_a_clean_rocm_exit(scenario: str) -> None:
    fields, faults, exitcode, frozen = SCENARIOS[scenario]
    config = EngineConfig(kv_cache_bytes=1 << 16, **fields)
    parent_end, child_end = multiprocessing.Pipe()
    # the engine process gets SIGTERM before its engine exists; it must still shut down cleanly
    faults = ChildFaults(signal_before_engine=True, **faults)

    record = probe_exit(run_engine_core, config, child_end, faults=faults, timeout=30.0)
    parent_end.close()
    child_end.close()

    assert not record.timed_out, record.stderr_tail
    assert record.exitcode == exitcode, record.stderr_tail
    assert record.gc_freeze_count is not None  # the child reached the end of its finally blocks
    assert (record.gc_freeze_count > 0) is frozen, record
