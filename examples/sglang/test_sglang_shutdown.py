"""The checks on SGLang's own shutdown code, one line per check, as SGLang's tests would hold them.

Runs when ``sglang`` is importable (``make sglang-check`` builds a side venv with the sglang
0.5.23 wheel); skipped with the reason otherwise. What runs is SGLang's: ``kill_process_tree``,
``kill_itself_when_parent_died``, ``Engine.__init__`` and its launch path and ``Engine.shutdown``;
``fake_workers`` replaces only the scheduler, detokenizer and tokenizer manager (they need a
model and CUDA). Where SGLang 0.5.23 breaks the contract the check is a strict xfail naming the
upstream code, so it turns XPASS (and fails the run) once SGLang changes.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin in (None, "namespace"):  # this folder is not SGLang
    pytest.skip(
        "sglang is not installed here: `make sglang-check` runs these tests in a side venv",
        allow_module_level=True,
    )

from sglang.srt.utils import kill_process_tree  # noqa: E402
from sglang_engines import make_engine, shutdown_scoped  # noqa: E402

from pytest_shutdown import (  # noqa: E402
    Finding,
    ShutdownContractError,
    assert_finalizes_on_gc,
    assert_idempotent_shutdown,
    assert_no_collateral,
)

HERE = Path(__file__).parent
UPSTREAM = "sglang 0.5.23 python/sglang/srt/entrypoints/engine.py"
#: SGLang's class, as a finding names an object's class; its file, as a creation site names it
ENGINE = "sglang.srt.entrypoints.engine.Engine"
ENGINE_FILE = os.path.join("sglang", "srt", "entrypoints", "engine.py")
#: ``record_property(FOUND, text)``: a line the summary of conftest.py prints under the check
FOUND = "found"
#: Every test that builds an Engine leaves what Engine.__init__ does to the process (the forced
#: start method, the SIGQUIT handler, the atexit hold, and the first time the process's event
#: loop: uvloop's epoll, io_uring, eventfd and pipes, never closed) and, on Engine.shutdown,
#: kills every child of the process (multiprocessing's resource tracker). The inner run below
#: reports each of these once; here they are the known behaviour of SGLang 0.5.23, not this
#: test's leak.
ENGINE_LEAVES = pytest.mark.allow_leaks(
    global_state=True,
    atexit=True,
    collateral=True,
    fds=True,
    reason="Engine.__init__/shutdown of sglang 0.5.23: reported by the checks below",
)


# -- sglang/srt/utils/common.py: kill_process_tree ------------------------------------------------


@ENGINE_LEAVES  # the resource tracker it kills was alive before the test: checked here instead
@pytest.mark.exercises("sglang.srt.utils.kill_process_tree(os.getpid(), include_parent=False)")
@pytest.mark.xfail(
    strict=True,
    raises=ShutdownContractError,
    reason=f"{UPSTREAM} Engine.shutdown: kill_process_tree(os.getpid(), include_parent=False) "
    "SIGKILLs every child of the process, not only the engine's",
)
def test_the_blanket_kill_takes_everything_with_it() -> None:
    tracker = running_resource_tracker()
    try:
        assert_no_collateral(kill_process_tree, os.getpid(), include_parent=False)
    except ShutdownContractError as error:
        assert error.codes == ["collateral-kill"], error.codes
        message = error.findings[0].message
        for sentinel in ("plain child", "multiprocessing child", "grandchild"):
            assert sentinel in message, message
        assert killed_by(tracker) == signal.SIGKILL, "the resource tracker survived"
        raise


@ENGINE_LEAVES
@pytest.mark.exercises("sglang.srt.entrypoints.engine.Engine.shutdown (scoped kill)")
def test_a_shutdown_scoped_to_the_engines_children_kills_nothing_else() -> None:
    engine = make_engine()
    tracker = running_resource_tracker()
    assert_no_collateral(shutdown_scoped, engine)
    assert all(not _alive(pid) for pid in engine.get_all_child_pids())
    assert killed_by(tracker) is None, "the scoped shutdown killed the resource tracker"


# -- sglang/srt/entrypoints/engine.py: Engine -----------------------------------------------------


@ENGINE_LEAVES
@pytest.mark.exercises("sglang.srt.entrypoints.engine.Engine.__init__ (atexit.register)")
@pytest.mark.xfail(
    strict=True,
    raises=ShutdownContractError,
    reason=f"{UPSTREAM} Engine.__init__: atexit.register(self.shutdown) keeps every Engine "
    "alive until the interpreter exits",
)
def test_a_dropped_engine_is_collected(record_property: Callable[[str, object], None]) -> None:
    try:
        assert_finalizes_on_gc(make_engine)
    except ShutdownContractError as error:
        # gc.get_referrers cannot see atexit's hold: the helper names atexit as the root
        assert error.codes == ["not-collected"], error.codes
        (finding,) = error.findings
        assert finding.details.get("root") == "atexit", str(error)
        (callback,) = finding.details["atexit_callbacks"]
        assert callback["callback"] == f"{ENGINE}.shutdown", callback
        assert ENGINE_FILE in callback["registered_at"], callback  # Engine.__init__'s call
        record_property(FOUND, f"not-collected: {finding.message}")
        raise
    finally:
        gc.collect()


@ENGINE_LEAVES
@pytest.mark.exercises("sglang.srt.entrypoints.engine.Engine.shutdown")
def test_engine_shutdown_is_idempotent() -> None:
    assert_idempotent_shutdown(make_engine())


INNER_TEST = """
    from sglang_engines import make_engine

    def test_builds_and_shuts_down_an_engine():
        make_engine().shutdown()
"""


# the resource tracker an earlier test's Engine.shutdown() SIGKILLed is still a zombie child of
# this process when this test starts (nobody reaps it): the guard would blame this test
@pytest.mark.allow_leaks(collateral=True, reason="an earlier Engine.shutdown()'s victim")
@pytest.mark.exercises("sglang.srt.entrypoints.engine.Engine.__init__ (under the guard)")
@pytest.mark.xfail(
    strict=True,
    raises=ShutdownContractError,
    reason=f"{UPSTREAM} Engine.__init__: atexit.register(self.shutdown) holds every Engine until "
    "the interpreter exits; _set_envs_and_config: mp.set_start_method('spawn', force=True) and "
    "signal.signal(SIGQUIT, ...) for the whole process, never put back; the event loop it "
    "creates for the process is never closed",
)
def test_the_guard_sees_a_test_that_builds_an_engine_leave_the_process_clean(
    record_property: Callable[[str, object], None],
) -> None:
    """The guard, in its own pytest run, on a test that builds and shuts down SGLang's Engine.

    Its findings (read from that run's ``--shutdown-report``) are raised here as they are, so
    the status line and the summary of this run show them: the guard's ``atexit-holds-object``
    on the real ``Engine``, with the site of the ``atexit.register`` call that holds it.
    """
    findings = guard_findings_on(INNER_TEST)
    if not findings:
        return  # the guard found nothing: the strict xfail turns XPASS and fails the run
    text = "\n".join(str(ShutdownContractError([f])) for f in findings)
    codes = {f.code for f in findings}
    assert "global-state" in codes, text
    assert "start method" in text and "SIGQUIT" in text, text
    assert "fd-leak" in codes and "epoll instance" in text, text  # its event loop
    # Engine.__init__'s atexit.register(self.shutdown), found by the guard on the Engine itself
    held = [f for f in findings if f.code == "atexit-holds-object"]
    assert held, f"the guard no longer finds the Engine held by atexit:\n{text}"
    (finding,) = held
    assert finding.details["held"] == [ENGINE], finding.details
    assert finding.details["callback"] == f"{ENGINE}.shutdown", finding.details
    site = str(finding.details["registered_at"])
    assert ENGINE_FILE in site and "atexit.register(self.shutdown)" in site, site
    record_property(FOUND, f"atexit-holds-object: {finding.message}")
    record_property(FOUND, "registered at:\n" + site.replace(f"{os.getcwd()}{os.sep}", ""))
    raise ShutdownContractError(findings)


def guard_findings_on(source: str) -> list[Finding]:
    """The guard's findings (fail mode) on the test file ``source``, run by its own pytest."""
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    # a plain temporary folder: pytest's session-scoped tmp_path_factory, set up inside this
    # test, would own (and be blamed for) what earlier tests left behind
    with tempfile.TemporaryDirectory(prefix="sglang-guard-") as folder:
        Path(folder, "test_inner.py").write_text(textwrap.dedent(source), encoding="utf-8")
        report_path = Path(folder, "shutdown.json")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "shutdown", "-p", "no:cacheprovider",
             "-p", "no:randomly", "-q", "-W", "ignore", f"--shutdown-report={report_path}",
             "test_inner.py"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600,
        )
        out = result.stdout + result.stderr
        # 0: nothing found; 1: the guard failed the test; anything else: the run broke
        assert result.returncode in (0, 1), out[-4000:]
        report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["complete"], (report.get("incomplete"), out[-4000:])
    findings = [Finding.from_dict(f) for test in report["tests"] for f in test["findings"]]
    assert bool(findings) == (result.returncode == 1), out[-4000:]
    return findings


def running_resource_tracker() -> int:
    """The pid of multiprocessing's resource tracker, a child of this process (started here)."""
    resource_tracker.ensure_running()
    pid = resource_tracker._resource_tracker._pid
    assert pid is not None
    return int(pid)


def killed_by(pid: int) -> int | None:
    """The signal that ended child ``pid`` (left unreaped for its owner), None if it runs."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
