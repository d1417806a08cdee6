"""A launcher that daemonises its scheduler (fork, ``setsid``, fork, the middle parent exits)
and whose shutdown stops only the launcher: the scheduler is re-parented and outlives it, holding
its port and its GPU (SGLang #31645 / #23627: schedulers re-parented to PID 1 for an hour).
Fixed: the scheduler stays a child of the launcher, in the launcher's own process group, and
shutdown ends the whole group.

``no_leaks`` finds the scheduler although its parent exited, by the marker every process started
in the block carries in its environment (the guard's session marker under the plugin); nothing is
re-parented to the test, which sees what it would see without the check.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys

import pytest

from pytest_shutdown import ShutdownContractError, no_leaks
from pytest_shutdown.orphans import kill_process_trees

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="re-parenting is contained on Linux"
)

SCHEDULER = "import time\nfor _ in range(600): time.sleep(0.1)"

DAEMONISING_LAUNCHER = f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    daemon = os.fork()
    if daemon:
        print(daemon, flush=True)  # the launcher is ready once its scheduler runs
        os._exit(0)
    os.execv(sys.executable, [sys.executable, "-c", {SCHEDULER!r}, "scheduler"])
os.wait()
for _ in range(600):
    time.sleep(0.1)
"""

LAUNCHER = f"""
import subprocess, sys, time
scheduler = subprocess.Popen([sys.executable, "-c", {SCHEDULER!r}, "scheduler"])
for _ in range(600):
    time.sleep(0.1)
"""


class BuggyLauncher:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DAEMONISING_LAUNCHER], stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as ready:  # every wait has a deadline
            ready.register(self.proc.stdout, selectors.EVENT_READ)
            assert ready.select(30), "the launcher did not start its scheduler in 30 s"
        self.scheduler_pid = int(self.proc.stdout.readline())

    def shutdown(self) -> None:
        self.proc.kill()  # the daemonised scheduler is not its child any more: it stays
        self.proc.wait(10)
        self.proc.stdout.close()  # type: ignore[union-attr]


class FixedLauncher:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], start_new_session=True)

    def shutdown(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher's group: scheduler included
        self.proc.wait(10)


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="scheduler left behind")
def test_buggy_launcher_leaves_its_daemonised_scheduler_behind() -> None:
    try:
        with no_leaks(grace=1.0):
            BuggyLauncher().shutdown()
    except ShutdownContractError as error:
        assert error.codes == ["process-leak"], error.codes
        (record,) = error.findings[0].details["processes"]
        assert "scheduler" in record["cmdline"]
        kill_process_trees([record["pid"]])  # the example cleans up after itself
        raise


def test_fixed_launcher_ends_its_scheduler_with_it() -> None:
    with no_leaks(grace=5.0):
        launcher = FixedLauncher()
        launcher.shutdown()
