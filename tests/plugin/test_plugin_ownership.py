"""Whose leak is it: the guard blames only what the test owns (pytester, real pools).

One side: shared, lazily started and process-lifetime resources are never a test's leak, cost no
grace, and are never killed (both modes, and under xdist). Other side: the test's own leaks are
still caught even beside a shared pool, and a wider-scope fixture's pool that is never shut down
is blamed on that fixture.
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

import pytest

#: A grace no correct run waits out: a test that passes under it did not wait the grace.
LONG_GRACE = "--shutdown-grace=60"
#: Generous bound on the guard's total time when nothing is the test's: far below one grace.
NO_GRACE_WAITED_S = 30.0

OWNED = textwrap.dedent(
    """
    import contextlib, multiprocessing, socket, sys, threading
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
    from multiprocessing import resource_sharer

    import pytest

    CTX = multiprocessing.get_context("fork")

    # A module-level process pool shared by two tests.
    SHARED = ProcessPoolExecutor(1, mp_context=CTX)

    # A singleton, like loky's get_reusable_executor().
    _reusable = None

    def get_reusable_executor():
        global _reusable
        if _reusable is None:
            _reusable = ThreadPoolExecutor(2, thread_name_prefix="reusable")
        return _reusable

    # A pool bound at import by a decorator, like pebble's @concurrent.process(pool=...).
    def on_pool(pool):
        def decorate(fn):
            fn.__name__ = fn.__qualname__ = "_original_" + fn.__name__  # picklable by name
            setattr(sys.modules[fn.__module__], fn.__name__, fn)

            def submit(*args):
                return pool.submit(fn, *args)
            return submit
        return decorate

    @on_pool(ProcessPoolExecutor(1, mp_context=CTX))
    def square(x):
        return x * x

    class Service:
        pool = ThreadPoolExecutor(1, thread_name_prefix="class-attribute")

    class LazyEngine:
        # Starts its pool on first use, like ReferenceLLM's renderer; closes it on close().
        def __init__(self):
            self._stack = contextlib.ExitStack()
            self._pool = None

        def run(self, fn, *args):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="lazy-engine")
                self._stack.callback(self._pool.shutdown, wait=False)
            return self._pool.submit(fn, *args).result()

        def close(self):
            self._stack.close()

    @pytest.fixture(scope="session")
    def session_pool():
        with ThreadPoolExecutor(2, thread_name_prefix="session-pool") as pool:
            yield pool

    @pytest.fixture(scope="module")
    def engine():
        engine = LazyEngine()
        yield engine
        engine.close()

    @pytest.fixture(scope="module")
    def engine_in_generator():
        engine = LazyEngine()  # only the suspended generator holds it
        yield engine.run
        engine.close()

    def test_session_pool_starts_its_threads_here(session_pool):
        assert session_pool.submit(sum, [1, 2]).result() == 3

    def test_session_pool_again(session_pool):
        assert list(session_pool.map(abs, [-1, -2])) == [1, 2]

    def test_module_engine_starts_its_pool_here(engine):
        assert engine.run(abs, -3) == 3

    def test_generator_engine(engine_in_generator):
        assert engine_in_generator(abs, -4) == 4

    def test_shared_process_pool_first():
        assert SHARED.submit(abs, -1).result(timeout=60) == 1

    def test_shared_process_pool_second():
        assert SHARED.submit(abs, -2).result(timeout=60) == 2

    def test_reusable_first():
        assert get_reusable_executor().submit(abs, -5).result() == 5

    def test_reusable_second():
        assert get_reusable_executor().submit(abs, -6).result() == 6

    def test_decorated_first():
        assert square(3).result(timeout=60) == 9

    def test_decorated_second():
        assert square(4).result(timeout=60) == 16

    def test_class_attribute_pool():
        assert Service.pool.submit(abs, -7).result() == 7

    def test_resource_sharer_listener():
        a, b = socket.socketpair()
        with a, b:
            resource_sharer.DupFd(a.fileno())  # starts the listener thread, process-lifetime
    """
)


def _report(pytester: pytest.Pytester, name: str = "r.json") -> dict:
    return json.loads((pytester.path / name).read_text())


@pytest.mark.parametrize(
    "mode", [["--shutdown-guard=fail"], ["--shutdown-guard=warn"], ["-p", "shutdown", "-n", "2"]]
)
def test_shared_and_lazy_pools_are_not_the_tests_leak(
    pytester: pytest.Pytester, mode: list[str]
) -> None:
    pytester.makepyfile(test_owned=OWNED)
    result = pytester.runpytest_subprocess(
        *mode,
        "-W",
        "error::pytest_shutdown.plugin.guard.ShutdownLeakWarning",
        LONG_GRACE,
        "--shutdown-report=r.json",
        "-p",
        "no:randomly",
    )
    # Nothing killed: the second user of each shared pool still works (no BrokenProcessPool).
    result.assert_outcomes(passed=12)
    report = _report(pytester)
    assert [t["findings"] for t in report["tests"]] == [[]] * len(report["tests"])
    assert report["summary"]["findings"] == {}
    # Owned threads cost no grace: the whole run's guard time is far below one 60 s grace.
    assert report["guard_s"] < NO_GRACE_WAITED_S
    # Module globals and class attributes are listed at the end, with who first started them.
    owners = {(r["owner"]["kind"], r["owner"]["name"]) for r in report["long_lived"]}
    assert ("module-global", "test_owned.SHARED") in owners
    assert ("module-global", "test_owned._reusable") in owners
    assert ("module-global", "test_owned.square") in owners
    assert ("class-attribute", "test_owned.Service.pool") in owners
    # Fixtures' pools are not long-lived (checked at the fixtures' teardown), nor is the
    # standard library's resource_sharer.
    names = " ".join(str(r.get("name")) for r in report["long_lived"])
    assert "session-pool" not in names and "lazy-engine" not in names
    firsts = {
        r["first_test"] for r in report["long_lived"] if r["owner"]["name"] == "test_owned.SHARED"
    }
    first = "test_owned.py::test_shared_process_pool_first"
    if "-n" in mode:  # each worker has its own globals, started by its first test using them
        assert firsts <= {first, "test_owned.py::test_shared_process_pool_second"}
    else:
        assert firsts == {first}
    result.stdout.fnmatch_lines(
        [
            "*long-lived resources (*, owned by module globals or class attributes; listed):",
            "  thread 'reusable_0' owned by module-global test_owned._reusable, first started "
            "in test_owned.py::test_reusable_first",
        ]
    )


def test_a_long_lived_socket_is_named_by_its_address_and_its_process(
    pytester: pytest.Pytester,
) -> None:
    """A unix socket has no port: the summary names its path and the process holding it,
    never ``port <pid>``; a TCP port is named by its address and port."""
    pytester.makepyfile(
        test_sockets=textwrap.dedent(
            """
            import socket

            UNIX = TCP = None

            def test_binds_module_sockets():
                global UNIX, TCP
                UNIX = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                TCP = socket.socket()
                UNIX.bind("s.sock")
                UNIX.listen()
                TCP.bind(("127.0.0.1", 0))
                TCP.listen()
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "--shutdown-report=r.json"
    )
    result.assert_outcomes(passed=1)
    ports = [r for r in _report(pytester)["long_lived"] if r["kind"] == "port"]
    assert len(ports) == 2, ports
    (pid,) = {r["pid"] for r in ports}  # the inner run's, which holds both
    result.stdout.fnmatch_lines_random(
        [
            f"  listening unix socket *s.sock (process {pid}) owned by module-global "
            "test_sockets.UNIX, first started in test_sockets.py::test_binds_module_sockets",
            f"  TCP socket listening on 127.0.0.1:* (process {pid}) owned by module-global "
            "test_sockets.TCP, *",
        ]
    )
    assert f"port {pid}" not in result.stdout.str()


def test_long_lived_resources_can_fail_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_global=textwrap.dedent(
            """
            from concurrent.futures import ThreadPoolExecutor

            POOL = ThreadPoolExecutor(1, thread_name_prefix="global-pool")

            def test_uses_the_global_pool():
                assert POOL.submit(abs, -1).result() == 1
            """
        )
    )
    listed = pytester.runpytest_subprocess("-p", "shutdown")
    listed.assert_outcomes(passed=1)
    assert listed.ret == 0
    listed.stdout.fnmatch_lines(["*thread 'global-pool_0' owned by module-global*"])

    failing = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-long-lived=fail")
    failing.assert_outcomes(passed=1)
    assert failing.ret == pytest.ExitCode.TESTS_FAILED
    failing.stdout.fnmatch_lines(["*long-lived resources (1, *; failed):"])

    bad = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-long-lived=maybe")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(
        ["*--shutdown-long-lived: 'maybe' is not accepted; accepted: list, fail"]
    )


MINE = textwrap.dedent(
    """
    import threading, time
    from concurrent.futures import ThreadPoolExecutor

    import pytest

    class Scheduler:
        # The APScheduler pattern: a scheduler thread started by start(), stopped by stop().
        def __init__(self):
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

        def _run(self):
            while not self._stop.wait(0.05):
                pass

        def start(self):
            self._thread.start()

        def stop(self):
            self._stop.set()
            self._thread.join(10)

    class NeverStopping:
        # A pool whose workers keep it alive: dropping it does not stop them.
        def __init__(self):
            self._threads = []

        def submit(self):
            thread = threading.Thread(target=self._work, name="never-stopping", daemon=True)
            self._threads.append(thread)
            thread.start()

        def _work(self):
            while True:
                time.sleep(0.05)

    @pytest.fixture(scope="session")
    def session_pool():
        with ThreadPoolExecutor(2, thread_name_prefix="session-pool") as pool:
            yield pool

    @pytest.fixture(scope="session")
    def forgotten_pool():
        yield NeverStopping()  # never shut down

    @pytest.fixture
    def scheduler():
        scheduler = Scheduler()
        scheduler.start()
        yield scheduler  # never stopped

    def test_real_leak_beside_a_session_pool(session_pool):
        assert session_pool.submit(abs, -1).result() == 1
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="mine-beside-pool", daemon=True).start()

    def test_function_fixture_scheduler_never_stopped(scheduler):
        pass

    def test_thread_in_a_local():
        local = threading.Thread(target=threading.Event().wait, name="in-a-local", daemon=True)
        local.start()

    def test_uses_forgotten_pool(forgotten_pool):
        forgotten_pool.submit()

    def test_last():
        pass
    """
)


@pytest.mark.parametrize(
    "mode",
    [
        ["-p", "shutdown"],
        ["--shutdown-guard=warn"],
        ["-p", "shutdown", "-n", "2", "--dist=loadfile"],
    ],
)
def test_the_tests_own_leaks_are_still_caught(pytester: pytest.Pytester, mode: list[str]) -> None:
    pytester.makepyfile(test_mine=MINE)
    result = pytester.runpytest_subprocess(
        *mode, "--shutdown-grace=0.3", "--shutdown-report=r.json", "-p", "no:randomly"
    )
    by_id = {t["nodeid"]: t for t in _report(pytester)["tests"]}
    assert sorted(by_id) == [
        "test_mine.py::test_function_fixture_scheduler_never_stopped",
        "test_mine.py::test_last",
        "test_mine.py::test_real_leak_beside_a_session_pool",
        "test_mine.py::test_thread_in_a_local",
    ]
    beside = by_id["test_mine.py::test_real_leak_beside_a_session_pool"]["findings"]
    assert [t["name"] for t in beside[0]["details"]["threads"]] == ["mine-beside-pool"]
    (forgotten,) = by_id["test_mine.py::test_last"]["findings"]
    assert forgotten["details"]["owner"]["fixture"] == "forgotten_pool"
    assert "fixture 'forgotten_pool' (session scope)" in forgotten["message"]
    if "--shutdown-guard=warn" in mode:
        result.assert_outcomes(passed=5, warnings=4)  # warn never changes an outcome
        return
    result.assert_outcomes(passed=5, errors=4)
    result.stdout.fnmatch_lines(
        [
            "ERROR test_mine.py::test_real_leak_beside_a_session_pool - *",
            "ERROR test_mine.py::test_function_fixture_scheduler_never_stopped - *",
            "ERROR test_mine.py::test_thread_in_a_local - shutdown guard: [[]thread-leak]*",
            # The session fixture's pool is blamed on the fixture, at its teardown (the last
            # test of the session), not on the test that used it.
            "ERROR test_mine.py::test_last - shutdown guard: [[]thread-leak]*",
        ]
    )


@pytest.mark.parametrize("extra", [[], ["-n", "2", "--dist", "loadfile"]])
def test_warn_mode_changes_nothing(
    pytester: pytest.Pytester, child_script: str, extra: list[str]
) -> None:
    pytester.makepyfile(
        test_warn=textwrap.dedent(
            f"""
            import gc, os, pathlib, subprocess, sys

            CHILD = "{child_script}"

            def test_leaks_a_process_and_a_freeze():
                proc = subprocess.Popen([sys.executable, "-c", CHILD])
                pathlib.Path("child.pid").write_text(str(proc.pid))
                gc.freeze()

            def test_then_both_are_still_there():
                pid = int(pathlib.Path("child.pid").read_text())
                os.kill(pid, 0)  # not killed by the guard
                assert gc.get_freeze_count() > 0  # not unfrozen by the guard
                gc.unfreeze()
                os.kill(pid, 9)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "--shutdown-guard=warn", "--shutdown-grace=0.3", "-p", "no:randomly", *extra
    )
    result.assert_outcomes(passed=2, warnings=1)


FAILING = textwrap.dedent(
    """
    import threading

    def test_fails_with_a_thread_alive():
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="alive-at-failure", daemon=True).start()
        assert 1 == 2
    """
)


@pytest.mark.parametrize("extra", [[], ["-n", "2"]])
def test_a_failed_test_is_one_report(pytester: pytest.Pytester, extra: list[str]) -> None:
    pytester.makepyfile(test_failing=FAILING)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", LONG_GRACE, "--shutdown-report=r.json", "--junitxml=junit.xml", *extra
    )
    result.assert_outcomes(failed=1)  # no second ERROR for the same test
    result.stdout.fnmatch_lines(
        [
            "*- Captured shutdown guard teardown -*",
            "[[]thread-leak] 1 thread started in test_fails_with_a_thread_alive still running "
            "(no grace was given): 'alive-at-failure' (target *).",
        ]
    )
    (record,) = _report(pytester)["tests"]
    assert record["reported"] is False
    assert [f["code"] for f in record["findings"]] == ["thread-leak"]
    assert record["guard_s"] < NO_GRACE_WAITED_S  # the 60 s grace was not waited
    properties = [p.get("name") for p in ET.parse(pytester.path / "junit.xml").iter("property")]
    assert properties == ["shutdown:thread-leak"]


def test_findings_say_where_it_was_started(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_where=textwrap.dedent(
            """
            import multiprocessing, threading, time
            from concurrent.futures import ThreadPoolExecutor

            release = threading.Event()

            def park():
                time.sleep(60)

            def test_generic_thread_name():
                pool = ThreadPoolExecutor(1)
                pool.submit(release.wait, 60)  # the line the finding must name

            def test_forked_child():
                context = multiprocessing.get_context("fork")
                proc = context.Process(target=park, name="parker", daemon=True)
                proc.start()

            def test_release():
                release.set()
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.3", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*thread 'ThreadPoolExecutor-*_0'*",
            "*started at (user frames first), during test_where.py::test_generic_thread_name:",
            '*File "*test_where.py", line *, in test_generic_thread_name',
            "*pool.submit(release.wait, 60)  # the line the finding must name",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*process * (python*): ForkProcess 'parker', target test_where.park",
            "*started at (user frames first), during test_where.py::test_forked_child:",
            "*proc.start()",
        ]
    )


def test_a_session_reference_llm_starts_its_renderer_pool_in_the_first_test(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")  # the reference engine needs torch; a missing torch only
    pytester.makepyfile(
        test_llm=textwrap.dedent(
            """
            import pytest
            from pytest_shutdown.engine.config import EngineConfig
            from pytest_shutdown.engine.llm import ReferenceLLM

            @pytest.fixture(scope="session")
            def llm():
                config = EngineConfig(
                    platform="cpu", kv_cache_bytes=1 << 16, renderer_num_workers=2
                )
                with ReferenceLLM(config, multiprocess=False) as llm:
                    yield llm

            def test_first_generate(llm):
                (out,) = llm.generate(["hello"])
                assert out.token_ids

            def test_second_generate(llm):
                (out,) = llm.generate(["again"])
                assert out.token_ids
            """
        )
    )
    for mode in ("fail", "warn"):
        result = pytester.runpytest_subprocess(
            f"--shutdown-guard={mode}",
            LONG_GRACE,
            "-W",
            "error::pytest_shutdown.plugin.guard.ShutdownLeakWarning",
        )
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines([f"no findings in 2 tests (guard in {mode} mode, grace 60 s)"])


def test_a_fixture_torn_down_after_a_failed_test_still_gets_its_grace(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_slow_stop=textwrap.dedent(
            """
            import threading, time
            import pytest

            @pytest.fixture(scope="module")
            def service():
                stop = threading.Event()

                def run():
                    stop.wait()
                    time.sleep(0.3)  # takes a moment to wind down after being told

                thread = threading.Thread(target=run, name="slow-stopper")
                thread.start()
                yield thread
                stop.set()  # not joined: it ends within the grace

            def test_fails_last(service):
                assert False
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-grace=30", "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["no findings in 1 test (guard in fail mode, grace 30 s)"])


ON_ITS_WAY_OUT = textwrap.dedent(
    """
    import gc, os, threading, time

    # No automatic collection: one that ran while a feeder lived would move its queue to the
    # oldest generation, where only a whole-heap collection (the settle's, after the ownership
    # search) releases the pipe; how many objects pytest allocates decides when one runs.
    gc.disable()

    class Queue:  # multiprocessing's Queue: a feeder thread holding a pipe, in a cycle
        def __init__(self, linger):
            self.files = [os.fdopen(fd, "rb" if i == 0 else "wb") for i, fd in enumerate(os.pipe())]
            self.me = self
            self.linger = linger
            self.thread = threading.Thread(target=self._feed, name="feeder", daemon=True)
            self.thread.start()

        def _feed(self):
            time.sleep(self.linger)  # on its way out when the test ends

    def test_queue_closing_on_its_way_out():
        Queue(0.005)

    def test_queue_running_past_the_grace():
        Queue(3.0)
    """
)

COUNT_HEAP_PASSES = textwrap.dedent(
    """
    import gc

    _real = gc.get_referrers
    PASSES = {}

    def _counted(*objs):
        PASSES[CURRENT[0]] = PASSES.get(CURRENT[0], 0) + 1
        return _real(*objs)

    gc.get_referrers = _counted
    CURRENT = [None]

    def pytest_runtest_setup(item):
        CURRENT[0] = item.name

    def pytest_sessionfinish(session):
        with open("passes.txt", "w") as f:
            f.write(repr(PASSES))
    """
)


def test_a_thread_ending_just_after_the_test_costs_no_ownership_walk(
    pytester: pytest.Pytester,
) -> None:
    """A queue's feeder thread a few milliseconds from its end, and the pipe it holds: let go
    before the ownership search (whose backward walk is a heap pass per level); one running
    past the grace is still a thread-leak and its pipe an fd-leak."""
    pytester.makepyfile(test_queue=ON_ITS_WAY_OUT)
    # The brief wait and the walk's start made generous (they are 20 and 10 ms): on a loaded
    # machine the feeder thread may take longer than 10 ms to end, and this tests that what
    # ends within them is let go before any walk, not how fast the machine is.
    pytester.makeconftest(
        COUNT_HEAP_PASSES
        + "\nimport pytest_shutdown.plugin.guard as _g\n_g._BRIEF_S = 0.25\n"
        + "import pytest_shutdown.plugin.guard.owners as _o\n_o._WALK_AFTER_S = 0.2\n"
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.3", "--shutdown-report=r.json", "-p", "no:randomly"
    )
    by_id = {t["nodeid"]: t for t in _report(pytester)["tests"]}
    assert sorted(by_id) == ["test_queue.py::test_queue_running_past_the_grace"]
    past = by_id["test_queue.py::test_queue_running_past_the_grace"]
    assert [f["code"] for f in past["findings"]] == ["thread-leak", "fd-leak"]
    result.assert_outcomes(passed=2, errors=1)
    passes = eval((pytester.path / "passes.txt").read_text())  # noqa: S307 - our own repr
    # The fd kind's tool-holder test over the pipe's wrappers takes two passes; the walk
    # would add one per level.
    assert passes.get("test_queue_closing_on_its_way_out", 0) <= 2


HELD_OR_LOOSE = textwrap.dedent(
    """
    import threading

    import registry  # keeps the monitor thread for the life of the process

    def test_starts_the_monitor():
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait, name="monitor", daemon=True)
        thread.start()
        registry.HELD.append((thread, stop))

    def test_leaves_a_thread_of_its_own():
        stop = threading.Event()
        threading.Thread(target=stop.wait, args=(3.0,), name="loose", daemon=True).start()

    def test_leaves_a_thread_ending_later_in_the_wait():
        stop = threading.Event()
        threading.Thread(target=stop.wait, args=(0.3,), name="slow", daemon=True).start()
    """
)

#: The brief wait made longer than any run: waiting it out is seen, not timed to the ms.
LONG_BRIEF_WAIT = textwrap.dedent(
    """
    import pytest_shutdown.plugin.guard

    pytest_shutdown.plugin.guard._BRIEF_S = 40.0
    """
)


#: Names what each ownership search with a backward walk was asked about.
COUNT_WALKS = textwrap.dedent(
    """
    import pytest_shutdown.ownership.owners

    _real = pytest_shutdown.ownership.owners.find_owners

    def _counted(targets, roots, **options):
        if options.get("walk", True):
            with open("walks.txt", "a") as f:
                f.write(" ".join(getattr(t, "name", repr(t)) for t in targets.values()) + "\\n")
        return _real(targets, roots, **options)

    pytest_shutdown.ownership.owners.find_owners = _counted
    """
)


def test_a_thread_a_global_holds_is_not_waited_for(pytester: pytest.Pytester) -> None:
    """A thread still running a moment into the brief wait is searched for an owner then: one
    a module global holds (of a module other than the one that started it: no forward search
    finds it) is not waited for (the wait here is 40 s), and it is listed as long-lived, not
    blamed on the test."""
    pytester.makepyfile(test_monitor=HELD_OR_LOOSE, registry="HELD = []")
    pytester.makeconftest(LONG_BRIEF_WAIT)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", LONG_GRACE, "--shutdown-report=r.json", "-p", "no:randomly",
        "--durations=0", "--durations-min=0", "test_monitor.py::test_starts_the_monitor",
    )
    result.assert_outcomes(passed=1)
    report = _report(pytester)
    assert report["tests"] == []
    assert [(r["name"], r["owner"]["name"]) for r in report["long_lived"]] == [
        ("monitor", "registry.HELD")
    ]
    teardown = [line for line in result.outlines if " teardown " in line]
    assert len(teardown) == 1
    assert float(teardown[0].split("s ", 1)[0]) < NO_GRACE_WAITED_S


def test_a_thread_nothing_holds_is_searched_for_once(pytester: pytest.Pytester) -> None:
    """The other side: a thread of the test's own, still running past the grace, is waited for
    and reported; the owner search made during the wait is not made again after it."""
    pytester.makepyfile(test_monitor=HELD_OR_LOOSE, registry="HELD = []")
    pytester.makeconftest(LONG_BRIEF_WAIT + COUNT_WALKS)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-grace=0.3", "--shutdown-report=r.json", "-p", "no:randomly",
        "test_monitor.py::test_leaves_a_thread_of_its_own",
    )
    result.assert_outcomes(passed=1, errors=1)
    (test,) = _report(pytester)["tests"]
    assert [f["code"] for f in test["findings"]] == ["thread-leak"]
    walks = (pytester.path / "walks.txt").read_text().split()
    assert walks == ["loose"]


MONITORED_LIBRARY = textwrap.dedent(
    """
    import threading

    class Bar:
        monitor = None  # the library's one monitor thread, started by the first bar

        def __init__(self):
            if Bar.monitor is None:
                stop = threading.Event()
                Bar.monitor = threading.Thread(target=stop.wait, name="bar-monitor", daemon=True)
                Bar.monitor.stop = stop
                Bar.monitor.start()
    """
)


def test_a_thread_its_own_library_keeps_is_known_without_a_heap_pass(
    pytester: pytest.Pytester,
) -> None:
    """A library that keeps its monitor thread in a class attribute (tqdm's ``tqdm.monitor``)
    is searched forwards from the module that started the thread: owned at once, with no wait
    and no heap pass, and listed as long-lived under its class attribute."""
    pytester.makepyfile(
        barlib=MONITORED_LIBRARY,
        test_bar="import barlib\n\ndef test_first_bar():\n    barlib.Bar()\n",
    )
    pytester.makeconftest(LONG_BRIEF_WAIT + COUNT_HEAP_PASSES)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", LONG_GRACE, "--shutdown-report=r.json", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=1)
    report = _report(pytester)
    assert report["tests"] == []
    assert [(r["name"], r["owner"]["kind"], r["owner"]["name"]) for r in report["long_lived"]] == [
        ("bar-monitor", "class-attribute", "barlib.Bar.monitor")
    ]
    passes = eval((pytester.path / "passes.txt").read_text())  # noqa: S307 - our own repr
    assert passes.get("test_first_bar", 0) == 0


def test_a_thread_nothing_holds_is_still_waited_for_after_the_search(
    pytester: pytest.Pytester,
) -> None:
    """Correct code is not accused: a thread of the test's own that the owner search (made
    10 ms into the wait) leaves unowned, and that ends later in the wait, is no finding; the
    search is made once, not again after the wait."""
    pytester.makepyfile(test_monitor=HELD_OR_LOOSE, registry="HELD = []")
    pytester.makeconftest(LONG_BRIEF_WAIT + COUNT_WALKS)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", LONG_GRACE, "--shutdown-report=r.json", "-p", "no:randomly",
        "test_monitor.py::test_leaves_a_thread_ending_later_in_the_wait",
    )
    result.assert_outcomes(passed=1)
    assert _report(pytester)["tests"] == []
    assert (pytester.path / "walks.txt").read_text().split() == ["slow"]
