"""End to end: shutdown_processes on real processes, and the timeout matrix.

Graces are scaled down (15 s -> GRACE_S); ``teardown_delay_s`` makes an engine's cleanup slower
than a budget. The ROCm decisions are taken on the CPU by forcing ``platform="rocm"``.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

import pytest
from engine_proc_testing import (
    DEFAULT_TIMEOUT_S,
    GRACE_S,
    alive,
    assert_gone,
    fast_config,
    sleeper,
    stubborn,
)

from pytest_shutdown.engine.processes import (
    EngineProcManager,
    kill_process_tree,
    shutdown_processes,
)
from pytest_shutdown.engine.start import mp_context

FORCE_KILL_MESSAGE = "force killing remaining processes count="


@pytest.fixture
def started() -> Iterator[list[BaseProcess]]:
    """Processes a test starts; any still running at teardown are killed with their trees."""
    procs: list[BaseProcess] = []
    yield procs
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            kill_process_tree(proc.pid)
            proc.join(5)


def start(procs: list[BaseProcess], target, *args) -> tuple[BaseProcess, object]:
    """Start ``target(parent_pid, conn, *args)`` through the fork server; wait for its hello."""
    ctx = mp_context("forkserver")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(os.getpid(), child_conn, *args), name=f"p{len(procs)}")
    procs.append(proc)
    proc.start()
    child_conn.close()
    assert parent_conn.poll(30), "the child never said hello"
    kind, payload = parent_conn.recv()
    parent_conn.close()
    assert kind == "ready"
    return proc, payload


def force_kill_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pytest_shutdown.engine" and r.getMessage().startswith(FORCE_KILL_MESSAGE)
    ]


# -- shutdown_processes --------------------------------------------------------------------------
def test_none_means_the_default_timeout_and_cooperative_processes_are_not_killed(
    started: list[BaseProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pytest_shutdown.engine")
    a, _ = start(started, sleeper)
    b, _ = start(started, sleeper)

    outcome = shutdown_processes([a, b], None, default_timeout=2.5)

    assert outcome.timeout == 2.5
    assert outcome.exitcodes == {"p0": -15, "p1": -15}  # SIGTERM, default action
    assert outcome.force_killed == []
    assert outcome.duration_s < 2.5
    assert force_kill_warnings(caplog) == []


def test_survivors_and_their_whole_trees_are_killed_with_one_warning(
    started: list[BaseProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pytest_shutdown.engine")
    a, grandchild_a = start(started, stubborn, True)
    b, grandchild_b = start(started, stubborn, True)
    c, _ = start(started, sleeper)
    assert isinstance(grandchild_a, int) and isinstance(grandchild_b, int)

    outcome = shutdown_processes([a, b, c], 0.5)

    assert sorted(outcome.force_killed) == ["p0", "p1"]
    assert outcome.exitcodes == {"p0": -9, "p1": -9, "p2": -15}
    assert force_kill_warnings(caplog) == [f"{FORCE_KILL_MESSAGE}2"]
    assert_gone([grandchild_a, grandchild_b], what="grandchildren of the killed processes")


def test_one_shared_deadline_not_one_per_process(started: list[BaseProcess]) -> None:
    procs = [start(started, stubborn, False)[0] for _ in range(3)]

    outcome = shutdown_processes(procs, 1.0)

    assert len(outcome.force_killed) == 3
    # Three per-process waits would take >= 3 s; one shared deadline takes ~1 s.
    assert 1.0 <= outcome.duration_s < 2.5, outcome


def test_a_sigterm_to_the_whole_group_leaves_the_fork_server_and_the_real_exit_status(
    started: list[BaseProcess],
) -> None:
    # A signal to a process group reaches the fork server too (a DP child's engines share its
    # group). A fork server killed by it took the exit statuses it had not reported yet with it:
    # Popen answered 255 for a process that died of SIGTERM.
    from multiprocessing import forkserver

    proc, _ = start(started, sleeper)
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert proc.pid is not None and server is not None

    for pid in (server, proc.pid):
        os.kill(pid, signal.SIGTERM)
    proc.join(10)

    assert proc.exitcode == -signal.SIGTERM  # its fork unblocked SIGTERM: the default action
    assert alive(server)


def test_processes_never_started_are_left_alone() -> None:
    proc = mp_context("forkserver").Process(target=sleeper, name="never")
    outcome = shutdown_processes([proc], 0.1)
    assert outcome.exitcodes == {} and outcome.force_killed == []


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "5", True])
def test_a_bad_timeout_is_rejected_naming_the_option(bad: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        shutdown_processes([], bad)  # type: ignore[arg-type]


# -- the timeout matrix, end to end ----------------------------------------------------------------
# (platform, request timeout, process timeout offered, teardown, timeout expected, force-killed)
MATRIX = {
    # The bug this guards against: 0/0 on ROCm means "abort requests at once", not "kill the
    # process at once".
    "rocm-0/0-gets-the-cleanup-grace": ("rocm", 0.0, 0.0, 0.3, GRACE_S, False),
    "cuda-0/0-gets-no-grace": ("cuda", 0.0, 0.0, 0.3, 0.0, True),
    "cpu-0/0-gets-no-grace": ("cpu", 0.0, 0.0, 0.3, 0.0, True),
    # A zero budget left from a positive drain timeout is spent time: no new grace.
    "rocm-spent-drain-budget-gets-no-grace": ("rocm", 1.0, 0.0, 0.3, 0.0, True),
    "rocm-None-means-the-default": ("rocm", 0.0, None, 0.3, DEFAULT_TIMEOUT_S, False),
    "rocm-positive-budget-is-kept": ("rocm", 0.0, 2.0, 0.3, 2.0, False),
    "teardown-outlasting-a-positive-budget": ("rocm", 0.0, 0.5, 2.5, 0.5, True),
    "teardown-outlasting-the-grace": ("rocm", 0.0, 0.0, GRACE_S + 2.0, GRACE_S, True),
}


@pytest.mark.parametrize("cell", list(MATRIX), ids=list(MATRIX))
def test_timeout_matrix_end_to_end(cell: str, caplog: pytest.LogCaptureFixture) -> None:
    platform, request_timeout, offered, teardown, expected, killed = MATRIX[cell]
    caplog.set_level(logging.INFO, logger="pytest_shutdown.engine")
    config = fast_config(
        platform=platform, shutdown_timeout=request_timeout, teardown_delay_s=teardown
    )
    manager = EngineProcManager(config)
    try:
        outcome = manager.shutdown(offered)
    finally:
        manager.shutdown(0)

    assert outcome is not None and outcome is manager.last_outcome
    assert outcome.timeout == expected
    assert bool(outcome.force_killed) is killed, outcome
    assert outcome.exitcodes == {"EngineCore_DP0": -9 if killed else 0}
    assert force_kill_warnings(caplog) == ([f"{FORCE_KILL_MESSAGE}1"] if killed else [])
    grace_logged = any("ROCm cleanup grace" in r.getMessage() for r in caplog.records)
    assert grace_logged is (expected != offered and offered is not None)


PRELOAD_SCRIPT = """
import psutil
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.processes import EngineProcManager
from pytest_shutdown.engine.start import helper_process_pids

if __name__ == "__main__":
    manager = EngineProcManager(EngineConfig(platform="cpu"))
    engine = manager.processes[0].pid
    server = psutil.Process(engine).ppid()
    assert server in helper_process_pids(), "the engine is not a child of the fork server"
    maps = [m.path for m in psutil.Process(server).memory_maps()]
    print(any("libtorch" in path for path in maps))
    manager.shutdown()
"""


def test_the_fork_server_has_torch_preloaded(tmp_path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    # A fresh interpreter: in this one another test may have started the fork server first.
    script = tmp_path / "preload.py"
    script.write_text(PRELOAD_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", "the fork server did not load torch before forking"
