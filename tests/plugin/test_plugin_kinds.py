"""The guard's newer kinds on real pytest runs: native threads, atexit holders, collateral
kills (caught on buggy code, silent on correct code)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from inner_runs import server_fixture

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/task (Linux)"
)

NATIVE = textwrap.dedent(
    """
    import _thread, ctypes, threading, time

    libc = ctypes.CDLL(None)
    START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    _keep = []

    def pthread(seconds, name=None, join=False):
        # a thread started in C: libc's sleep() as the start routine, no Python at all
        routine = ctypes.cast(libc.sleep, START)
        tid = ctypes.c_ulong()
        assert libc.pthread_create(ctypes.byref(tid), None, routine, ctypes.c_void_p(seconds)) == 0
        if name:
            libc.pthread_setname_np(tid, name.encode())
        if join:
            libc.pthread_join(tid, None)
        _keep.append(tid)

    LOCK = _thread.allocate_lock()
    LOCK.acquire()

    def test_start_new_thread():
        _thread.start_new_thread(LOCK.acquire, ())

    def test_c_thread():
        pthread(60)

    def test_c_thread_of_a_known_pool():
        pthread(60, "grpc_global_tim")

    def test_c_thread_allowed_by_ini():
        pthread(60, "mypool-1")

    def test_c_thread_joined():
        pthread(0, join=True)

    def test_python_thread_joined():
        t = threading.Thread(target=time.sleep, args=(0.01,))
        t.start()
        t.join()
    """
)


@linux_only
def test_native_threads_are_found_with_tid_and_kernel_name(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nshutdown_native_threads_allow =\n    mypool-*\n")
    pytester.makepyfile(test_native=NATIVE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.2", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=6, errors=2)
    for test in ("test_start_new_thread", "test_c_thread"):
        result.stdout.fnmatch_lines(
            [
                f"*::{test}: ?thread-leak? 1 native thread (not listed by threading) started "
                f"in {test} still running after the 0.2 s grace: * (*)."
            ]
        )
    out = result.stdout.str()
    assert "  native thread " in out and "(tid " in out
    assert "LOCK.acquire" not in out or "test_native.py" in out  # a Python stack when known
    for clean in ("known_pool", "allowed_by_ini", "joined"):
        assert f"test_c_thread_{clean}: [" not in out


def test_allow_leaks_threads_also_covers_native_threads(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_native=NATIVE.replace(
            "def test_c_thread():",
            "import pytest\n@pytest.mark.allow_leaks(threads=True, reason='a C pool')\n"
            "def test_c_thread():",
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.2", "-k", "test_c_thread and not pool and not ini"
    )
    result.assert_outcomes(passed=2, deselected=4)


def test_numpys_openblas_pool_is_a_process_lifetime_pool(pytester: pytest.Pytester) -> None:
    """numpy's wheels ship OpenBLAS as ``libscipy_openblas64_``: its worker pool, started by a
    test's first matrix product and kept until exit, is never that test's leak."""
    pytest.importorskip("numpy")
    pytester.makepyfile(
        test_blas=textwrap.dedent(
            """
            import numpy as np

            def test_first_product():
                a = np.ones((300, 300))
                assert (a @ a)[0, 0] == 300
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-grace=0.2")
    result.assert_outcomes(passed=1)
    assert "thread-leak" not in result.stdout.str()


ATEXIT = textwrap.dedent(
    """
    import atexit
    import pytest

    class Engine:
        def __init__(self):
            atexit.register(self.shutdown)  # SGLang's Engine.__init__

        def shutdown(self):
            pass

    class TidyEngine:
        def __init__(self):
            atexit.register(self.shutdown)

        def shutdown(self):
            atexit.unregister(self.shutdown)

    def _close_all():
        pass

    GLOBAL_ENGINE = None
    HOOKS = []

    class HookedEngine:
        def __init__(self):
            hook = self.shutdown
            atexit.register(hook)
            HOOKS.append(hook)  # a module global holds the engine through the very same method

        def shutdown(self):
            pass

    def test_bound_method_of_the_tests_engine():
        Engine()

    def test_module_function():
        atexit.register(_close_all)
        atexit.register(print, "bye")

    def test_unregistered_at_shutdown():
        TidyEngine().shutdown()

    def test_engine_of_a_module_global():
        global GLOBAL_ENGINE
        GLOBAL_ENGINE = Engine()

    @pytest.fixture(scope="module")
    def engine():
        return Engine()

    def test_engine_whose_hook_a_module_global_holds():
        HookedEngine()

    def test_uses_module_engine(engine):
        pass

    def test_last():
        pass
    """
)


def test_atexit_holding_a_tests_object_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_atexit=ATEXIT)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(passed=7, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_bound_method_of_the_tests_engine: ?atexit-holds-object? "
            "atexit.register(test_atexit.Engine.shutdown) in "
            "test_bound_method_of_the_tests_engine (by Engine.__init__ "
            "at test_atexit.py:*) keeps test_atexit.Engine alive until the interpreter exits*",
            "*test_last: ?atexit-holds-object? atexit.register(test_atexit.Engine.shutdown) in "
            "fixture 'engine' (module scope) (by Engine.__init__ at test_atexit.py:*) keeps "
            "test_atexit.Engine alive*",
        ]
    )
    out = result.stdout.str()
    for clean in (
        "module_function",
        "unregistered_at_shutdown",
        "engine_of_a_module_global",
        "engine_whose_hook_a_module_global_holds",
    ):
        assert f"test_{clean}: [" not in out


def test_pytests_own_atexit_registrations_are_never_a_tests(pytester: pytest.Pytester) -> None:
    """tmp_path's first use makes pytest register its own atexit cleanup (an ExitStack's close)
    during a test: pytest's registrations are not the test's."""
    pytester.makepyfile(
        test_tmp=textwrap.dedent(
            """
            def test_first_use(tmp_path):
                (tmp_path / "a").write_text("1")

            def test_second_use(tmp_path):
                (tmp_path / "b").write_text("1")
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert "atexit-holds-object" not in result.stdout.str()


def test_not_collected_names_atexit_as_the_root() -> None:
    import atexit

    from pytest_shutdown import ShutdownContractError, assert_finalizes_on_gc

    class Held:
        def __init__(self) -> None:
            atexit.register(self.shutdown)

        def shutdown(self) -> None:
            pass

    with pytest.raises(ShutdownContractError) as caught:
        assert_finalizes_on_gc(Held, timeout=0.5)
    (finding,) = [f for f in caught.value.findings if f.code == "not-collected"]
    assert finding.details["root"] == "atexit"
    assert "Its root is atexit: atexit.register(" in finding.message
    assert "Held.shutdown) holds it until the interpreter exits" in finding.message
    assert "test_plugin_kinds.py" in finding.details["atexit_callbacks"][0]["registered_at"]


COLLATERAL = server_fixture("session", "kill") + textwrap.dedent(
    """
    import os, signal, time
    import psutil

    def test_starts_server(server):
        assert server.poll() is None

    def test_shutdown_kills_every_child(server):
        own = subprocess.Popen(SLEEP)
        # SGLang's Engine.shutdown(): kill_process_tree(os.getpid(), include_parent=False)
        victims = psutil.Process(os.getpid()).children(recursive=True)
        for child in victims:
            child.send_signal(signal.SIGKILL)
        own.wait(10)
        deadline = time.monotonic() + 10  # the kills have landed (a loaded machine is slow)
        while time.monotonic() < deadline and any(
            v.is_running() and v.status() != psutil.STATUS_ZOMBIE for v in victims
        ):
            time.sleep(0.01)

    def test_tidy_shutdown():
        own = subprocess.Popen(SLEEP)
        own.kill()
        own.wait(10)
    """
)


@linux_only
def test_a_wider_fixtures_process_killed_during_a_test_is_collateral(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_collateral=COLLATERAL)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_shutdown_kills_every_child: ?collateral-kill? 1 process "
            "test_shutdown_kills_every_child did not start (alive before it, a wider-scope "
            "fixture's or an earlier test's) died by a signal during "
            "test_shutdown_kills_every_child: * (*) by SIGKILL (sent by "
            "test_shutdown_kills_every_child at test_collateral.py:*).",
        ]
    )
    assert "test_tidy_shutdown: [" not in result.stdout.str()


OWNER_ENDS_ITS_OWN = textwrap.dedent(
    """
    import gc, signal, subprocess, sys
    import pytest

    SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]

    class Executor:  # a reusable executor: a module global's, its worker in a cycle with it
        def __init__(self):
            self.worker = subprocess.Popen(SLEEP)
            self.me = self

        def shutdown(self):  # a timeout's shutdown: kills and reaps its own worker
            self.worker.send_signal(signal.SIGKILL)
            self.worker.wait(10)

    POOL = {}

    def test_starts_the_executor():
        POOL["executor"] = Executor()

    def test_timeout_shuts_it_down_and_drops_it():
        executor = POOL.pop("executor")
        gc.collect()  # alive here: the oldest generation, which no young collection frees
        executor.shutdown()
        del executor  # garbage now, in a cycle, its Popen's returncode says SIGKILL

    def test_starts_a_held_one():
        POOL["held"] = Executor()

    def test_kills_the_held_ones_worker():
        POOL["held"].shutdown()  # the module global still holds it: not its own drop
    """
)


@linux_only
def test_a_process_its_dropped_owner_killed_and_reaped_is_never_collateral(
    pytester: pytest.Pytester,
) -> None:
    """Whether the dropped owner's object was already freed when the check ran (gc's timing)
    decided the verdict: the check collects before it decides. A live owner's kill is still
    collateral."""
    pytester.makepyfile(test_own=OWNER_ENDS_ITS_OWN)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-guard=fail"
    )
    result.assert_outcomes(passed=4, errors=1)
    out = result.stdout.str()
    assert "test_timeout_shuts_it_down_and_drops_it: [" not in out
    result.stdout.fnmatch_lines(["*test_kills_the_held_ones_worker: ?collateral-kill? 1 process*"])


ZOMBIE_REAPED_LATER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    import pytest

    @pytest.fixture(scope="session")
    def server():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        yield proc
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)

    @pytest.mark.allow_leaks(collateral=True, reason="kills the server on purpose")
    def test_kills_the_server_and_leaves_it_unreaped(server):
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{server.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)

    def test_reaps_the_dead_server(server):
        assert server.wait(10) == -signal.SIGKILL
    """
)


@linux_only
def test_reaping_a_process_that_died_before_the_test_is_not_collateral(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_zombie=ZOMBIE_REAPED_LATER)
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert "collateral-kill" not in result.stdout.str()
