"""The orphan matrix on SGLang's real launch path, with fake worker processes.

``engine_launcher.py`` builds SGLang's ``Engine`` (``fake_workers`` in place of the model);
``kill_tree_at`` kills one level of that tree once it is ready and watches what is left. What
keeps the tree whole is SGLang's: ``kill_itself_when_parent_died`` (``PR_SET_PDEATHSIG``) in each
worker, and in the parent the ``SubprocessWatchdog`` with the launch-phase SIGQUIT handler.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import tempfile
from pathlib import Path

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin in (None, "namespace"):  # this folder is not SGLang
    pytest.skip(
        "sglang is not installed here: `make sglang-check` runs these tests in a side venv",
        allow_module_level=True,
    )

from pytest_shutdown import TreeDeath, kill_tree_at  # noqa: E402

LAUNCHER = [sys.executable, str(Path(__file__).with_name("engine_launcher.py"))]
# process names as /proc/PID/comm holds them (15 characters of what setproctitle set)
LEVELS = {"scheduler": "sglang::sched*", "detokenizer": "sglang::detok*"}
#: SGLang's launch takes a while on a loaded 2-core box (each worker imports sglang)
PHASE_TIMEOUT_S = 300.0


def every_process_died(death: TreeDeath) -> TreeDeath:
    """The tree died whole. What it leaves on disk is SGLang's ZMQ IPC socket files
    (``ipc:///tmp/tmpXXXX``, made by ``tempfile`` and removed only by a clean exit): a tree
    ended by SIGKILL cannot remove them, so the check reports them as ``port-leak`` (socket
    files, never a bound port) and removes them; they are inert, each start picks new names."""
    __tracebackhide__ = True
    assert {f.code for f in death.findings} <= {"port-leak"}, [f.message for f in death.findings]
    for finding in death.findings:
        assert not finding.details["ports"], finding.message  # no TCP/UDP port stays bound
        assert all(f["path"].startswith(tempfile.gettempdir())
                   for f in finding.details["socket_files"]), finding.message
    return death


@pytest.mark.exercises("sglang.srt.utils.kill_itself_when_parent_died (PR_SET_PDEATHSIG)")
def test_a_killed_engine_process_takes_its_workers_with_it() -> None:
    death = every_process_died(kill_tree_at(
        LAUNCHER, level="root", signal="SIGKILL", levels=LEVELS,
        phase_timeout_s=PHASE_TIMEOUT_S, deadline_s=30.0,
    ))
    assert death.root_exitcode == -signal.SIGKILL
    assert death.processes_at_signal >= 3  # root, scheduler, detokenizer (+ resource tracker)


@pytest.mark.exercises("sglang.srt.utils.watchdog.SubprocessWatchdog + SIGQUIT handler")
def test_a_killed_scheduler_brings_the_whole_engine_down() -> None:
    death = every_process_died(kill_tree_at(
        LAUNCHER, level="scheduler", signal="SIGKILL", levels=LEVELS,
        phase_timeout_s=PHASE_TIMEOUT_S, deadline_s=30.0,
    ))
    # The watchdog sees the scheduler gone and sends SIGQUIT to the engine's process; SGLang's
    # handler calls kill_process_tree(os.getpid()) with include_parent=True, which SIGKILLs the
    # other workers and then the process itself: it ends by SIGKILL (-9), so no atexit hook,
    # no finally and no Engine.shutdown runs there, and its exit status looks like an OOM kill.
    assert death.root_exitcode == -signal.SIGKILL, death.root_exitcode
