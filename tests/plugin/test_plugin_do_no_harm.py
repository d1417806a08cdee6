"""Do no harm: a fixture that stops its own process is not accused; fail mode kills only what
is certainly the test's (issue 44, items 3 and 4).

Each shape runs three times in real pytest processes: plain (``-p no:shutdown``), warn and
fail. Warn gives plain's outcome on every test; fail adds errors only on tests that leak.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time

import psutil
import pytest
from inner_runs import run_modes, server_fixture

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process checks read /proc (Linux)"
)


# --- a fixture that stops its own process is never accused -----------------------------------

#: After :func:`inner_runs.server_fixture`.
STOPS_ITS_OWN = """
class TestServer:
    def test_one(self, server):
        assert server.poll() is None

    def test_two(self, server):
        assert server.poll() is None

def test_after():
    pass
"""


@pytest.mark.parametrize("stop", ["terminate", "kill"])
@pytest.mark.parametrize("scope", ["function", "class", "module", "session"])
def test_a_fixture_that_stops_its_own_process_is_not_accused(
    pytester: pytest.Pytester, scope: str, stop: str
) -> None:
    pytester.makepyfile(test_server=server_fixture(scope, stop) + STOPS_ITS_OWN)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    assert "collateral-kill" not in result.stdout.str()
    result.assert_outcomes(passed=3)


BLANKET_KILL = server_fixture("module", "terminate") + """
import os, signal, time
import psutil

def test_uses(server):
    assert server.poll() is None

def test_kills_every_child(server):
    # SGLang's Engine.shutdown(): kill_process_tree(os.getpid(), include_parent=False)
    victims = psutil.Process(os.getpid()).children(recursive=True)
    for child in victims:
        child.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.poll() is None:
        time.sleep(0.01)
"""


def test_a_blanket_kill_of_a_fixtures_process_is_still_collateral(
    pytester: pytest.Pytester,
) -> None:
    """The other side: the module fixture's own teardown is not accused, a test's blanket kill
    of its process is."""
    pytester.makepyfile(test_blanket=BLANKET_KILL)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", "-rA")
    result.stdout.fnmatch_lines(
        ["*test_kills_every_child: ?collateral-kill? 1 process*by SIGKILL*"]
    )
    result.assert_outcomes(passed=2, errors=1)


#: A test that kills its own child without waiting for it, the way vLLM's ``shutdown()`` kills
#: an EngineCore that outlived its SIGTERM window: a process holding 500 MB takes tens of
#: milliseconds to free it, so it is still exiting, not yet a zombie, when the next test starts.
KILLED_ON_ITS_WAY_OUT = """
import os, signal, subprocess, sys, time

KEPT = []  # the engine manager keeps its Process objects: nothing reaps the child

def big_child():
    code = "a = bytearray(500_000_000); print('ready', flush=True); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\\n"
    child.stdout.close()
    KEPT.append(child)
    return child

def test_kills_its_own_child():
    os.kill(big_child().pid, signal.SIGKILL)  # no wait

def test_next():
    time.sleep(0.2)

def test_starts_another():
    big_child()

def test_kills_every_child():
    for child in KEPT:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
    time.sleep(0.2)

def test_reaps():
    for child in KEPT:
        child.wait(10)
"""


#: A server that drains for 0.3 s after SIGTERM, then dies of it (the default action, re-raised).
GRACEFUL_SERVERS = """
import os, signal, subprocess, sys, time
import pytest

DRAINS = (
    "import os, signal, time\\n"
    "def on_term(*args):\\n"
    "    time.sleep(0.3)\\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\\n"
    "signal.signal(signal.SIGTERM, on_term)\\n"
    "print('ready', flush=True)\\n"
    "time.sleep(60)\\n"
)
KEPT = []

def graceful_server(**kwargs):
    server = subprocess.Popen([sys.executable, "-c", DRAINS], stdout=subprocess.PIPE, **kwargs)
    assert server.stdout.readline() == b"ready\\n"
    server.stdout.close()
    KEPT.append(server)
    return server

@pytest.fixture(scope="module")
def shared_server():
    return graceful_server()

def test_stops_its_server_without_waiting():
    graceful_server().terminate()

def test_next():
    time.sleep(0.6)

def test_stops_its_servers_group_without_waiting():
    os.killpg(graceful_server(start_new_session=True).pid, signal.SIGTERM)

def test_next_again():
    time.sleep(0.6)

def test_uses_the_shared_server(shared_server):
    assert shared_server.poll() is None

def test_stops_the_shared_server(shared_server):
    os.kill(shared_server.pid, signal.SIGTERM)
    shared_server.wait(10)

def test_reaps():
    for server in KEPT:
        server.wait(10)
"""


@pytest.mark.parametrize("mode", ["warn", "fail"])
@pytest.mark.parametrize(
    ("suite", "accused", "passed"),
    [
        (
            KILLED_ON_ITS_WAY_OUT,
            "*test_kills_every_child: ?collateral-kill? 1 process*by SIGKILL*",
            5,
        ),
        (
            GRACEFUL_SERVERS,
            "*test_stops_the_shared_server: ?collateral-kill? 1 process*by SIGTERM (sent by "
            "test_stops_the_shared_server at test_suite.py:*",
            7,
        ),
    ],
    ids=["killed-still-exiting", "stopped-drains-its-signal"],
)
def test_a_death_an_earlier_test_caused_is_not_the_next_tests_collateral_kill(
    pytester: pytest.Pytester, mode: str, suite: str, accused: str, passed: int
) -> None:
    """No ``test_next*`` killed anything. ``killed-still-exiting``: the child the test before
    SIGKILLed was still freeing its memory when it started (vLLM's check accused the next test
    of an EngineCore its own ``shutdown()`` SIGKILLed). ``stopped-drains-its-signal``: the
    server the test before stopped (by pid or by process group) drained into it and died of
    that SIGTERM. The other side: a test that kills a child alive and well at its start, or
    stops a module fixture's server, is that process's collateral kill."""
    pytester.makepyfile(test_suite=suite)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", f"--shutdown-guard={mode}", "-rA"
    )
    assert not re.search(r"test_next\w*: \[collateral-kill\]", result.stdout.str())
    result.stdout.fnmatch_lines([accused])
    result.assert_outcomes(passed=passed, errors=1 if mode == "fail" else 0)


# --- warn and fail mode leave process parentage alone ----------------------------------------

ORPHANS = """
import os, signal, subprocess, sys
import psutil, pytest

def test_an_orphaned_grandchild_is_not_ours():
    code = ("import subprocess, sys; g = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(20)']); print(g.pid, flush=True)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    g = int(p.stdout.readline())
    p.wait()
    p.stdout.close()
    try:
        with pytest.raises(ChildProcessError):
            os.waitpid(g, os.WNOHANG)
        assert g not in [c.pid for c in psutil.Process().children(recursive=True)]
    finally:
        os.kill(g, signal.SIGKILL)

@pytest.mark.parametrize("n", range({tests}))
def test_short_lived_orphans(n):
    for _ in range(10):
        subprocess.run(["sh", "-c", "sleep 0.05 &"], check=True)

def test_zz_no_zombie_under_pytest():
    import time
    deadline = time.monotonic() + 5  # the last orphans end (0.05 s) and are reaped
    while True:
        zombies = [c.pid for c in psutil.Process().children()
                   if c.status() == psutil.STATUS_ZOMBIE]
        if len(zombies) <= 10 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(zombies) <= 10, zombies
"""


def test_process_parentage_is_the_same_in_every_mode(pytester: pytest.Pytester) -> None:
    """An orphan is PID 1's (or the host's subreaper's), as without the plugin: waitpid on it
    fails, no listing of pytest's children shows it; 300 short-lived orphans leave no zombie
    under pytest."""
    pytester.makepyfile(test_orphans=ORPHANS.format(tests=30))
    by_mode = run_modes(pytester)
    assert len(by_mode["plain"]) == 32
    assert set(by_mode["plain"].values()) == {"PASSED"}, by_mode["plain"]
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == by_mode["plain"]


def test_the_opt_in_subreaper_reaps_what_it_adopts_at_once(pytester: pytest.Pytester) -> None:
    """``--shutdown-containment=subreaper`` adopts orphans (that is its point) and reaps every
    one that ends: no zombie growth over 1,000 orphans."""
    pytester.makepyfile(test_orphans=ORPHANS.format(tests=100))
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-containment=subreaper", "-p", "no:randomly",
        "-k", "short_lived or zombie",
    )
    result.assert_outcomes(passed=101)


# --- a pool is stopped as a pool, never by killing its workers under it ----------------------

LEAKED_POOL = """
import threading
{imports}

def work(x):
    return x * 2

def test_leaks_a_pool():
    pool = {pool}(2)
    assert pool.map(work, range(20)) == [x * 2 for x in range(20)]
    stop = threading.Event()  # a thread keeps the pool alive past the test
    threading.Thread(target=lambda: stop.wait() and pool, daemon=True).start()

def test_next():
    pass
"""


def forked_pool_module() -> str:
    """multiprocessing.pool's code as another package's module, as billiard (celery's fork)
    ships it: a ``Pool`` of the same shape that is no subclass of multiprocessing's."""
    import inspect  # noqa: PLC0415
    import multiprocessing.pool  # noqa: PLC0415

    source = inspect.getsource(multiprocessing.pool)
    source = source.replace("from . import", "from multiprocessing import")
    return source.replace("from .connection import", "from multiprocessing.connection import")


@pytest.mark.parametrize(
    ("imports", "pool"),
    [
        pytest.param("import multiprocessing as mp", 'mp.get_context("fork").Pool', id="stdlib"),
        pytest.param("from forkedmp.pool import Pool", "Pool", id="a-fork-of-its-code"),
    ],
)
def test_a_leaked_pool_is_stopped_as_a_pool_and_the_exit_does_not_hang(
    pytester: pytest.Pytester, imports: str, pool: str
) -> None:
    """Killing a live Pool's workers made its handler re-spawn them and its exit-time
    finalizer wait forever on a lock a killed worker held: pytest never exited. A fork of
    multiprocessing's pool code (billiard's) hung the same way: its Pool is no subclass."""
    pytester.mkpydir("forkedmp").joinpath("pool.py").write_text(forked_pool_module())
    pytester.makepyfile(test_pool=LEAKED_POOL.format(imports=imports, pool=pool))
    by_mode = run_modes(pytester, guarded=("--shutdown-grace=0.5",))
    assert by_mode["plain"] == by_mode["warn"]
    assert set(by_mode["plain"].values()) == {"PASSED"}
    assert by_mode["fail"] == {**by_mode["plain"], "test_pool.py::test_leaks_a_pool": "ERROR"}


# --- a fork's process-lifetime helper that keeps no pid is no test's leak -------------------

PIDLESS_TRACKER = """
import os, sys, threading

class SemaphoreTracker:
    \"\"\"billiard's shape: started on first use, kept until exit; it keeps the pipe's write
    end, not the pid, and its process reads until the pipe closes.\"\"\"
    def __init__(self):
        self._lock = threading.Lock()
        self._fd = None

    def ensure_running(self):
        with self._lock:
            if self._fd is None:
                r, w = os.pipe()
                os.set_inheritable(r, True)
                code = f"from trackerpkg.semaphore_tracker import main;main({r})"
                os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)
                os.close(r)
                self._fd = w

def main(fd):
    with open(fd, "rb") as pipe:
        pipe.read()

_semaphore_tracker = SemaphoreTracker()
ensure_running = _semaphore_tracker.ensure_running
"""

FIRST_USE = """
from trackerpkg import semaphore_tracker

def test_first_use_starts_the_tracker():
    semaphore_tracker.ensure_running()

def test_next():
    pass
"""


def test_a_helper_known_by_its_command_line_is_not_a_leak(pytester: pytest.Pytester) -> None:
    """billiard's semaphore tracker and fork server keep no pid: the first test to use them
    errored in fail mode, and the process-lifetime helper was killed under the session."""
    pytester.mkpydir("trackerpkg").joinpath("semaphore_tracker.py").write_text(PIDLESS_TRACKER)
    pytester.makepyfile(test_tracker=FIRST_USE)
    by_mode = run_modes(pytester)
    assert set(by_mode["plain"].values()) == {"PASSED"}
    assert by_mode["plain"] == by_mode["warn"] == by_mode["fail"]


# --- what a session fixture's registry reaches is never the test's ---------------------------

GATEWAY_REGISTRY = """
import _thread, subprocess, sys, threading, pytest

ECHO = "import sys\\nfor line in sys.stdin: print(line, end='', flush=True)"
SERVE = [sys.executable, "-c", ECHO]

class Gateway:
    \"\"\"A process and its receiver thread, started as execnet's thread model does.\"\"\"
    def __init__(self):
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(SERVE, stdin=pipe, stdout=pipe, text=True)
        self.stop = threading.Event()
        _thread.start_new_thread(self.receive, ())
    def receive(self):
        self.stop.wait(60)
    def close(self):
        self.stop.set()
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()

class Group:
    def __init__(self):
        self.gateways = {}
    def terminate(self):
        for gw in self.gateways.values():
            gw.close()

@pytest.fixture(scope="session")
def group():
    g = Group()
    yield g
    g.terminate()

@pytest.fixture
def gw(group):
    if "gw" not in group.gateways:  # made by the first test that asks, kept by the group
        group.gateways["gw"] = Gateway()
    return group.gateways["gw"]

@pytest.mark.parametrize("n", range(6))
def test_echo(gw, n):
    gw.proc.stdin.write(f"{n}\\n")
    gw.proc.stdin.flush()
    assert gw.proc.stdout.readline() == f"{n}\\n"
"""


def test_what_a_session_fixtures_registry_reaches_is_not_killed(
    pytester: pytest.Pytester,
) -> None:
    """A function fixture hands out a gateway (a process and a ``_thread`` receiver thread)
    that a session fixture's registry keeps: the first test that used it is not blamed, and
    fail mode does not kill it under the later tests (execnet's suite: 11 failures plain, 441
    under the guard)."""
    pytester.makepyfile(test_gateways=GATEWAY_REGISTRY)
    by_mode = run_modes(pytester)
    assert len(by_mode["plain"]) == 6 and set(by_mode["plain"].values()) == {"PASSED"}
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == by_mode["plain"]


EXECNET_GROUP = """
import execnet, pytest

@pytest.fixture(scope="session")
def group():
    g = execnet.Group()
    yield g
    g.terminate(timeout=1)

@pytest.fixture
def gw(group):
    try:
        return group["popen"]
    except KeyError:
        return group.makegateway("popen//id=popen//execmodel=thread")

@pytest.mark.parametrize("n", range(4))
def test_remote(gw, n):
    channel = gw.remote_exec("channel.send(channel.receive() + 1)")
    channel.send(n)
    assert channel.receive() == n + 1
"""


def test_execnets_own_group_fixture_owns_its_gateways(pytester: pytest.Pytester) -> None:
    """The same shape on execnet itself (its own suite's conftest): its master-side objects
    are the suite's, walked through like any object, not skipped as the test tool's."""
    pytester.makepyfile(test_execnet=EXECNET_GROUP)
    by_mode = run_modes(pytester, "-p", "no:xdist")
    assert len(by_mode["plain"]) == 4 and set(by_mode["plain"].values()) == {"PASSED"}
    assert by_mode["warn"] == by_mode["plain"]
    assert by_mode["fail"] == by_mode["plain"]


# --- a process that leaves the tree after the check is still its test's ----------------------

LATE_DAEMON = """
import subprocess, time

def test_daemonises_late():
    # the launcher ends 0.5 s after the test; its daemon then leaves the tree
    subprocess.Popen(["sh", "-c", "sleep 0.5; setsid sleep 300 & echo $! > {pidfile}; exit 0"])

def test_next():
    import os
    deadline = time.monotonic() + 30  # the daemon has started (its pid is written)
    while not os.path.exists({pidfile!r}) or not open({pidfile!r}).read().strip():
        assert time.monotonic() < deadline
        time.sleep(0.01)

def test_last():
    pass
"""


@pytest.mark.parametrize("mode", ["warn", "fail"])
def test_a_process_that_leaves_the_tree_after_the_check_is_blamed_on_its_test(
    pytester: pytest.Pytester, mode: str
) -> None:
    pidfile = pytester.path / "late.pid"
    pytester.makepyfile(test_late=LATE_DAEMON.replace("{pidfile!r}", repr(str(pidfile))).replace(
        "{pidfile}", str(pidfile)))
    try:
        result = pytester.runpytest_subprocess(
            "-p", "shutdown", f"--shutdown-guard={mode}", "-p", "no:randomly", timeout=90
        )
        pid = int(pidfile.read_text())
        result.stdout.fnmatch_lines(
            [
                f"test_late.py::test_daemonises_late: [[]process-leak[]] 1 child process started "
                # (named as found: sh, setsid or sleep, the one pid exec'ing on)
                f"in test_daemonises_late still running after the test had ended: {pid} (*).*"
            ]
        )
        assert result.ret == (1 if mode == "fail" else 0)
        if mode == "fail":
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


HOPPER = """
import subprocess, sys, time
HOP = '''
import os, sys, time
with open(sys.argv[1], "a") as f: f.write(str(os.getpid()) + "\\\\n")
end = time.monotonic() + 30
while time.monotonic() < end:
    time.sleep(0.05)
    if os.fork():
        os._exit(0)
    with open(sys.argv[1], "a") as f: f.write(str(os.getpid()) + "\\\\n")
'''

def test_hopper():
    subprocess.Popen([sys.executable, "-c", HOP, {hops!r}])

def test_next():
    time.sleep(0.5)
"""


def test_a_fork_and_exit_hopper_is_blamed_on_its_test_and_does_not_outlive_fail_mode(
    pytester: pytest.Pytester,
) -> None:
    hops = pytester.path / "hops.txt"
    pytester.makepyfile(test_hop=HOPPER.replace("{hops!r}", repr(str(hops))))

    def alive() -> list[int]:
        pids = [int(p) for p in hops.read_text().split()] if hops.exists() else []
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]

    try:
        result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", timeout=90)
        result.stdout.fnmatch_lines(
            ["test_hop.py::test_hopper: [[]process-leak[]] *after the test had ended*"]
        )
        assert result.ret == 1
        deadline = time.monotonic() + 5  # a kill in flight lands
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(), "the hopper outlived the fail-mode run"
    finally:
        for pid in alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


ALLOWED_LATE = """
import subprocess, time, os, pytest

@pytest.mark.allow_leaks(processes=True, reason="a daemon the suite keeps")
def test_daemonises_late_allowed():
    subprocess.Popen(["sh", "-c", "sleep 0.3; setsid sleep 60 & echo $! > {pidfile}; exit 0"])

def test_next():
    deadline = time.monotonic() + 30
    while not os.path.exists({pidfile!r}) or not open({pidfile!r}).read().strip():
        assert time.monotonic() < deadline
        time.sleep(0.01)

def test_last():
    pass
"""


def test_a_late_process_of_a_test_that_allows_process_leaks_is_not_blamed(
    pytester: pytest.Pytester,
) -> None:
    """``allow_leaks(processes=True)`` covers what leaves the tree after the test too: no
    finding on any test, nothing killed under the later tests; fail mode's session-end sweep
    still lists and stops it."""
    pidfile = pytester.path / "allowed.pid"
    pytester.makepyfile(
        test_allowed=ALLOWED_LATE.replace("{pidfile!r}", repr(str(pidfile))).replace(
            "{pidfile}", str(pidfile)
        )
    )
    try:
        result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", timeout=90)
        result.assert_outcomes(passed=3)
        out = result.stdout.str()
        assert "after the test had ended" not in out
        result.stdout.fnmatch_lines(["<session end>: [[]process-leak[]]*killed."])
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


CUT_SHORT = """
import subprocess, sys

KEEP = []

def test_keeps_a_process_deep_in_a_global():
    KEEP.append([[subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]])

def test_the_process_was_not_stopped():
    proc = KEEP[0][0][0]
    try:
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
"""


def test_fail_mode_reports_but_does_not_stop_what_an_owner_search_could_not_finish(
    pytester: pytest.Pytester,
) -> None:
    """An owner search cut short by its bounds (here its depth, made 1) cannot say the process
    is the test's: reported, not killed; the later test still finds it running."""
    pytester.makeconftest(
        "import pytest_shutdown.ownership.owners as o\n"
        "o.find_owners.__kwdefaults__['max_depth'] = 1\n"
    )
    pytester.makepyfile(test_cut=CUT_SHORT)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", timeout=90)
    result.stdout.fnmatch_lines(
        ["*[[]process-leak[]]*1 of them not stopped: their owner search was cut short*"]
    )
    result.assert_outcomes(passed=2, errors=1)


# --- the recording wrappers are invisible ------------------------------------------------------

#: Errors raised through the wrappers that record starts and signals: each traceback must show
#: the frames it shows without the plugin.
RAISED_THROUGH_RECORDERS = """
import atexit, multiprocessing, os, signal, subprocess, threading

def test_an_atexit_registration_of_no_callable():
    atexit.register(42)  # TypeError

def test_a_kill_that_raises():
    os.kill(2**22 + 12345, signal.SIGTERM)  # no such process: ProcessLookupError

def test_a_command_that_does_not_exist():
    subprocess.Popen(["/nonexistent/command"])

def test_a_thread_started_twice():
    thread = threading.Thread(target=int)
    thread.start()
    thread.join()
    thread.start()

def test_a_process_started_twice():
    process = multiprocessing.get_context("fork").Process(target=int)
    process.start()
    process.join()
    process.start()

def test_os_kill_goes_to_a_process_pool():  # pickled by reference, found in the worker
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1) as pool:
        assert pool.submit(os.kill, os.getpid(), 0).result(timeout=60) is None

def test_signatures_read_as_the_originals():  # feature checks on a parameter of Popen
    import inspect
    assert "start_new_session" in inspect.signature(subprocess.Popen).parameters
    assert list(inspect.signature(os.kill).parameters) == ["pid", "signal"]
    assert threading.Thread.start.__qualname__ == "Thread.start"

def test_a_forked_child_has_the_builtin_kill():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if type(os.kill).__name__ == "builtin_function_or_method" else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
"""


def test_the_recording_wrappers_change_no_traceback_and_no_child(
    pytester: pytest.Pytester,
) -> None:
    """``Popen.__init__``, ``Thread.start``, ``Process.start``, ``atexit.register`` and
    ``os.kill`` record what they do (creation sites, who sent a signal) and are invisible: a
    failure through one shows the frames it shows without the plugin (they showed
    ``origins.py: in popen`` and the like); their signatures and names read as the originals'
    (``inspect.signature(subprocess.Popen)`` read ``(*args, **kwargs)``); ``os.kill`` still
    pickles (to a process pool); a forked child has the builtin back."""
    pytester.makepyfile(test_raised=RAISED_THROUGH_RECORDERS)
    plain = pytester.runpytest_subprocess("-p", "no:shutdown", "-p", "no:randomly")
    plain.assert_outcomes(passed=3, failed=5)
    frames = [line for line in plain.outlines if re.match(r"^\S+\.py:\d+: ", line)]
    assert any("subprocess.py" in line for line in frames), frames
    for mode in ("warn", "fail"):
        guarded = pytester.runpytest_subprocess(
            "-p", "shutdown", "-p", "no:randomly", f"--shutdown-guard={mode}"
        )
        guarded.assert_outcomes(passed=3, failed=5)
        assert [line for line in guarded.outlines if re.match(r"^\S+\.py:\d+: ", line)] == frames
        assert "pytest_shutdown" not in guarded.stdout.str()
