"""The engine's fast start and stop paths keep their contracts (issue 8).

* The fork server freezes its preloaded heap: a forked engine starts with a frozen heap that is
  not its own (EngineCore neither collects nor freezes), and releases it with its engine, so the
  freeze count it ends with is its own.
* A SIGTERM the kernel delivers to any thread of an idle engine wakes its loop at once (the
  signal wake-up fd), not at the loop's next idle timeout.
* After ``SystemExit`` an engine process skips interpreter finalization with the same exit code.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from engine_proc_testing import fast_config, wait_event, wait_for

from pytest_shutdown.engine import core_proc
from pytest_shutdown.engine.core_proc import ChildFaults, skip_finalization_at_exit
from pytest_shutdown.engine.processes import EngineProcManager

FROZEN_HEAP_SCRIPT = """
import json, sys
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core_proc import LifecycleLog
from pytest_shutdown.engine.processes import EngineProcManager
from pytest_shutdown.engine.start import heap_frozen_by_fork_server

if __name__ == "__main__":
    log = sys.argv[1]
    manager = EngineProcManager(EngineConfig(platform="cpu"), lifecycle_log=log)
    manager.shutdown()
    print(json.dumps([heap_frozen_by_fork_server(), LifecycleLog.read(log)]))
"""


def test_a_forked_engine_inherits_the_fork_servers_frozen_heap_and_releases_it(
    tmp_path: Path, log: str
) -> None:
    # A fresh interpreter: in this one another test may have started the fork server first.
    script = tmp_path / "frozen_heap.py"
    script.write_text(FROZEN_HEAP_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), log], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    frozen_here, records = json.loads(done.stdout.strip().splitlines()[-1])

    assert frozen_here is False  # the parent is no fork of a fork server
    started = next(r for r in records if r["event"] == "started")
    final = next(r for r in records if r["event"] == "final")
    assert started["freeze_count"] > 0, "the fork server's heap was not frozen"
    assert final["exit"] == 0 and final["freeze_count"] == 0, final


def _unblocked_other_thread(pid: int, signum: int) -> int:
    """A thread of ``pid`` other than its main thread that does not block ``signum``."""
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        if tid == pid:
            continue
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        if not int(blocked.split()[1], 16) & (1 << (signum - 1)):
            return tid
    raise AssertionError(f"no thread of {pid} but its main thread accepts signal {signum}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux only")
def test_a_sigterm_delivered_to_another_thread_wakes_the_idle_loop_at_once(
    managers: list[EngineProcManager], log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        pytest.skip("libc has no tgkill")
    # A forked engine inherits this: without the wake-up fd its idle loop would sleep 60 s.
    monkeypatch.setattr(core_proc, "IDLE_WAKE_S", 60.0)
    manager = EngineProcManager(fast_config(start_method="fork"), lifecycle_log=log)
    managers.append(manager)
    proc = manager.processes[0]
    assert proc.pid is not None
    tid = wait_for(
        lambda: _unblocked_other_thread(proc.pid, signal.SIGTERM), 5.0, "the engine's threads"
    )

    assert tgkill(proc.pid, tid, signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
    proc.join(10)

    assert proc.exitcode == 0, "the idle loop did not notice a SIGTERM sent to another thread"
    assert wait_event(log, "shutdown_requested", proc.pid)["signals"] == [signal.SIGTERM]


def _exit_through_atexit(marker: str, conn: Connection) -> None:
    """Child target: an earlier atexit callback would write ``marker``; then skip them all."""
    atexit.register(Path(marker).write_text, "finalization ran")
    conn.send(skip_finalization_at_exit(7))
    conn.close()


def test_skip_finalization_exits_with_the_code_before_the_other_atexit_callbacks(
    tmp_path: Path,
) -> None:
    assert skip_finalization_at_exit(0) is False  # not a multiprocessing child: nothing done
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    marker = tmp_path / "finalized"
    proc = ctx.Process(target=_exit_through_atexit, args=(str(marker), child_conn))
    proc.start()
    child_conn.close()
    try:
        assert parent_conn.poll(60) and parent_conn.recv() is True
        proc.join(30)
        assert proc.exitcode == 7  # the code given, from the first atexit callback
        assert not marker.exists(), "the other atexit callbacks (finalization) still ran"
    finally:
        parent_conn.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def test_a_spawned_engine_skips_finalization_with_its_own_exit_code(
    managers: list[EngineProcManager],
) -> None:
    manager = EngineProcManager(
        fast_config(start_method="spawn"), faults=ChildFaults(exit_code=2)
    )
    managers.append(manager)

    outcome = manager.shutdown()

    assert outcome is not None and not outcome.force_killed
    assert outcome.exitcodes == {"EngineCore_DP0": 2}  # SystemExit(2), not 0 from os._exit
