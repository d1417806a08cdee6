"""no_leaks and its primitives: real threads, processes and gc freezes; device memory on fakes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from inner_runs import ARGS, fresh_python

from pytest_shutdown import ShutdownContractError, no_leaks
from pytest_shutdown.helpers.leaks import (
    Started,
    assert_device_memory_released,
    await_exit,
    kill_process_trees,
    process_running,
    started_since,
    take_snapshot,
    thread_filter,
)


@pytest.fixture(autouse=True)
def no_kept_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test asks ``nothing_of_ours_since`` afresh: the answer kept for the same question
    (its markers) would be another test's, asked with other stand-ins."""
    import pytest_shutdown.resources.primitives as leaks

    monkeypatch.setattr(leaks, "_last_answer", None)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event that parked threads wait on; set at teardown so nothing outlives the test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; killed and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        kill_process_trees([proc.pid], timeout=5.0)
        proc.wait(timeout=10)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the walks down the descendants' children lists (from no cached scan)."""
    import pytest_shutdown.resources.primitives as leaks

    scans: list[int] = []
    real_walk = leaks._walk_descendants

    def walk(pid: int) -> frozenset[int] | None:
        scans.append(1)
        return real_walk(pid)

    monkeypatch.setattr(leaks, "_walk_descendants", walk)
    monkeypatch.setattr(leaks, "_scan_cache", None)
    return scans


def _start_and_join_a_thread() -> None:
    thread = threading.Thread(target=len, args=((),))
    thread.start()
    thread.join()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- thread-leak -----------------------------------------------------------------------------


def parked_worker(event: threading.Event) -> None:
    event.wait(30)


def test_thread_still_running_is_a_thread_leak_with_name_and_stack(
    release: threading.Event,
) -> None:
    with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
        threading.Thread(target=parked_worker, args=(release,), name="parked-1").start()
    (finding,) = caught.value.findings
    assert finding.code == "thread-leak"
    assert "'parked-1'" in finding.message
    (record,) = finding.details["threads"]
    assert record["name"] == "parked-1"
    assert "parked_worker" in record["stack"]
    json.dumps(finding.to_dict())  # details are JSON-serialisable


def test_thread_that_ends_within_the_grace_is_not_a_leak() -> None:
    start = time.monotonic()
    with no_leaks(grace=5.0):
        threading.Thread(target=time.sleep, args=(0.2,), name="short").start()
    # Polled: returns as soon as the thread ends, not after the grace.
    assert time.monotonic() - start < 4.0


def test_executor_shut_down_properly_is_not_a_leak() -> None:
    with no_leaks(grace=2.0):
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(abs, range(10)))


def test_executor_dropped_in_a_cycle_is_collected_not_accused() -> None:
    with no_leaks(grace=2.0):
        pool = ThreadPoolExecutor(max_workers=1)
        pool.submit(abs, 1).result()
        holder: dict[str, object] = {"pool": pool}
        holder["self"] = holder  # only a gc.collect() frees the executor and stops its worker
        del holder, pool


def test_allow_ignores_threads_by_glob_pattern_and_by_predicate(
    release: threading.Event,
) -> None:
    with no_leaks(grace=0.1, allow=["bg-*", lambda t: t.name == "other"]):
        threading.Thread(target=parked_worker, args=(release,), name="bg-poller").start()
        threading.Thread(target=parked_worker, args=(release,), name="other").start()
    with pytest.raises(ShutdownContractError, match="'not-allowed'"):
        with no_leaks(grace=0.1, allow=["bg-*"]):
            threading.Thread(target=parked_worker, args=(release,), name="not-allowed").start()


def test_threads_already_running_before_the_block_are_not_blamed(
    release: threading.Event,
) -> None:
    threading.Thread(target=parked_worker, args=(release,), name="older").start()
    with no_leaks(grace=0.1):
        pass


def test_thread_check_can_be_switched_off(release: threading.Event) -> None:
    with no_leaks(threads=False, grace=0.1):
        threading.Thread(target=parked_worker, args=(release,)).start()


# --- process-leak ----------------------------------------------------------------------------


def test_child_process_still_running_is_a_process_leak_with_command_line(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    (finding,) = caught.value.findings
    assert finding.code == "process-leak"
    (record,) = finding.details["processes"]
    assert record["pid"] == procs[0].pid
    assert record["cmdline"][-1] == "import time; time.sleep(60)"
    assert str(procs[0].pid) in finding.message


def test_grandchildren_are_found_recursively(procs: list[subprocess.Popen[bytes]]) -> None:
    script = "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.5):
        procs.append(subprocess.Popen([sys.executable, "-c", script]))
        deadline = time.monotonic() + 10
        while len(psutil.Process(procs[0].pid).children()) < 1:
            assert time.monotonic() < deadline, "the grandchild never started"
            time.sleep(0.02)
    names = {r["name"] for r in caught.value.findings[0].details["processes"]}
    assert "sleep" in names and len(caught.value.findings[0].details["processes"]) == 2


def test_process_waited_for_inside_the_block_is_not_a_leak() -> None:
    with no_leaks(grace=0.2):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_process_exiting_within_the_grace_is_not_a_leak(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    with no_leaks(grace=10.0):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"]))
    # Ended but not reaped by the block: a zombie is not running, and its owner can still wait().
    assert procs[0].wait(timeout=10) == 0


def test_process_running_tells_running_zombie_and_gone_apart(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Read from /proc without psutil: a zombie has ended, a reaped pid is gone; the same
    answers as psutil's status."""
    procs.append(
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
    )
    pid = procs[0].pid
    assert process_running(pid)
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert procs[0].stdin is not None
    procs[0].stdin.close()
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not process_running(pid)
    assert procs[0].wait(timeout=10) == 0
    assert not process_running(pid)
    assert process_running(os.getpid())


def test_kill_process_trees_kills_the_whole_tree(procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"]))
    deadline = time.monotonic() + 10
    while len(psutil.Process(procs[0].pid).children()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    tree = [procs[0].pid, *(c.pid for c in psutil.Process(procs[0].pid).children())]
    killed = kill_process_trees([procs[0].pid], timeout=5.0)
    assert sorted(r["pid"] for r in killed) == sorted(tree)
    assert not any(_running(pid) for pid in tree)
    assert procs[0].wait(timeout=5) == -9  # not reaped by the helper: the owner gets the status


ORPHANING_PARENT = """
import os, sys, time
pid = os.fork()
if pid == 0:  # the grandchild: let go of the pipe, then run on as an orphan
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
"""


def _orphan() -> int:
    """Start a child that forks a grandchild and exits at once: the grandchild's pid, an orphan."""
    parent = subprocess.run(
        [sys.executable, "-c", ORPHANING_PARENT], capture_output=True, timeout=30, check=True
    )
    return int(parent.stdout)


def _waitpid_outcome(pid: int) -> str:
    try:
        return f"returned {os.waitpid(pid, os.WNOHANG)}"
    except ChildProcessError:
        return "ChildProcessError"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="re-parenting, /proc (Linux)")
def test_an_orphan_stays_nobodys_child_in_the_block_and_is_still_reported() -> None:
    """No subreaper: inside the block an orphaned grandchild is re-parented as it is without
    the block (``os.waitpid`` on it raises ``ChildProcessError``; a subreaper made it succeed),
    and the block still reports it, found by the marker in its environment."""
    orphans = [_orphan()]
    try:
        without = _waitpid_outcome(orphans[0])
        with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
            orphans.append(_orphan())
            inside = _waitpid_outcome(orphans[1])
        assert inside == without == "ChildProcessError"
        (finding,) = caught.value.findings
        assert finding.code == "process-leak"
        (record,) = finding.details["processes"]
        assert record["pid"] == orphans[1] and record["ppid"] != os.getpid()
        assert record["reparented"] is True and record["adopted"] is False
    finally:
        kill_process_trees(orphans, timeout=10.0)
    assert not any(process_running(pid) for pid in orphans)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="re-parenting, /proc (Linux)")
def test_under_the_guard_the_block_uses_the_sessions_marker(pytester: pytest.Pytester) -> None:
    """In a guarded session (a marker watched already) the block puts no marker of its own in
    the environment, and an orphan is still nobody's child of ours and still reported."""
    pytester.makepyfile(
        test_inner=f"""
        import os, subprocess, sys
        import pytest
        from pytest_shutdown import ShutdownContractError, no_leaks
        from pytest_shutdown.orphans import kill_process_trees

        PARENT = {ORPHANING_PARENT!r}

        def test_orphan():
            marker = os.environ["PYTEST_SHUTDOWN_SESSION"]
            with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
                assert os.environ["PYTEST_SHUTDOWN_SESSION"] == marker
                out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True,
                                     timeout=30, check=True).stdout
                with pytest.raises(ChildProcessError):
                    os.waitpid(int(out), os.WNOHANG)
            kill_process_trees([int(out)], timeout=10.0)
            assert [r["pid"] for r in caught.value.findings[0].details["processes"]] == [int(out)]
        """
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-guard=warn")
    result.assert_outcomes(passed=1)


def test_the_block_leaves_the_environment_as_it_found_it() -> None:
    from pytest_shutdown._os import escaped
    from pytest_shutdown.ownership.containment import SESSION_MARKER_ENV

    before = os.environ.get(SESSION_MARKER_ENV)
    with no_leaks():
        inside = os.environ.get(SESSION_MARKER_ENV)
    assert os.environ.get(SESSION_MARKER_ENV) == before
    assert not escaped.watching()
    if sys.platform.startswith("linux"):
        assert inside is not None and inside != before  # a marker of the block's own


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="re-parenting, /proc (Linux)")
def test_a_block_in_another_thread_ending_first_leaves_the_marker_to_the_other() -> None:
    """Two blocks at once share the first one's marker: the first to end leaves it in place, so
    an orphan the other block makes afterwards is still found; the last to end removes it."""
    from pytest_shutdown._os import escaped
    from pytest_shutdown.ownership.containment import SESSION_MARKER_ENV

    before = os.environ.get(SESSION_MARKER_ENV)
    entered, leave = threading.Event(), threading.Event()

    def other_block() -> None:
        with no_leaks(grace=0.2):
            entered.set()
            leave.wait(30)

    other = threading.Thread(target=other_block)
    other.start()
    orphans: list[int] = []
    try:
        assert entered.wait(30)
        with pytest.raises(ShutdownContractError) as caught, no_leaks(threads=False, grace=0.2):
            leave.set()
            other.join(30)
            assert not other.is_alive() and escaped.watching()
            orphans.append(_orphan())
        assert [r["pid"] for r in caught.value.findings[0].details["processes"]] == orphans
    finally:
        leave.set()
        other.join(30)
        kill_process_trees(orphans, timeout=10.0)
    assert os.environ.get(SESSION_MARKER_ENV) == before and not escaped.watching()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc (Linux)")
def test_the_blocks_marker_is_looked_for_among_new_pids_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marker is new: no process older than the block carries it, so finding escaped ones
    never lists the host's processes (``/proc``), only the pids allocated since the entry."""
    from pytest_shutdown._os import escaped

    listings: list[int] = []
    real_listing = escaped._listing
    monkeypatch.setattr(escaped, "_listing", lambda: listings.append(1) or real_listing())
    with no_leaks(grace=0.1):
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=30)
    assert listings == []


# --- native threads --------------------------------------------------------------------------


class NativeThread:
    """A thread started in C (``pthread_create``, no Python in it: it waits on a semaphore),
    named so that no rule for unnamed pool workers applies."""

    def __init__(self, name: bytes) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.semaphore = ctypes.create_string_buffer(64)  # room for any sem_t
        assert self.libc.sem_init(self.semaphore, 0, 0) == 0
        self.tid = ctypes.c_ulong()
        routine = ctypes.cast(
            self.libc.sem_wait, ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
        )
        assert self.libc.pthread_create(ctypes.byref(self.tid), None, routine, self.semaphore) == 0
        self.libc.pthread_setname_np(self.tid, name)
        self.joined = False

    def release(self) -> None:
        self.libc.sem_post(self.semaphore)

    def join(self) -> None:
        if not self.joined:
            self.release()
            self.libc.pthread_join(self.tid, None)  # returns once sem_wait did: no deadline needed
            self.joined = True


@pytest.fixture
def native_threads() -> Iterator[list[NativeThread]]:
    """Native threads a test starts; released and joined at teardown."""
    started: list[NativeThread] = []
    yield started
    for thread in started:
        thread.join()


linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/task (Linux)"
)


@linux_only
def test_a_native_thread_left_running_is_a_thread_leak(native_threads: list[NativeThread]) -> None:
    with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
        native_threads.append(NativeThread(b"leaky-native"))
    (finding,) = caught.value.findings
    assert finding.code == "thread-leak"
    assert "native thread (not listed by threading)" in finding.message
    assert "the no_leaks() block" in finding.message
    (record,) = finding.details["threads"]
    assert record["name"] == "leaky-native" and record["native"] is True


@linux_only
def test_a_native_thread_that_ended_is_not_a_leak(native_threads: list[NativeThread]) -> None:
    with no_leaks(grace=5.0):
        native_threads.append(NativeThread(b"joined-native"))
        native_threads[-1].join()  # ended inside the block
        native_threads.append(NativeThread(b"ends-in-grace"))
        native_threads[-1].release()  # ends while the grace runs


@linux_only
def test_allow_and_threads_false_cover_native_threads(native_threads: list[NativeThread]) -> None:
    with no_leaks(grace=0.1, allow=["allowed-*"]):
        native_threads.append(NativeThread(b"allowed-native"))
    with no_leaks(grace=0.1, threads=False):
        native_threads.append(NativeThread(b"unchecked"))


@linux_only
def test_the_plugins_own_thread_started_in_a_block_is_none_of_its_leaks(
    native_threads: list[NativeThread],
) -> None:
    """The guard starts its own ``_thread`` threads when it needs them (a signal watcher, a
    budget's watchdog, a term() probe), maybe during a test: never that test's native thread
    (CI caught the signal watcher reported as one). A C thread beside it still is."""
    from pytest_shutdown._os.own_threads import start_own_thread

    stop = threading.Event()
    try:
        with no_leaks(grace=0.1):
            start_own_thread(stop.wait, (30,))
        with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.1):
            start_own_thread(stop.wait, (30,))
            native_threads.append(NativeThread(b"beside-ours"))
    finally:
        stop.set()
    (finding,) = caught.value.findings
    assert [r["name"] for r in finding.details["threads"]] == ["beside-ours"]


# --- gc-frozen-leak --------------------------------------------------------------------------


def test_gc_freeze_left_behind_is_a_gc_frozen_leak() -> None:
    at_entry = gc.get_freeze_count()  # not always 0: CPython 3.12.1 starts with 375 frozen
    try:
        with pytest.raises(ShutdownContractError) as caught, no_leaks():
            gc.freeze()
    finally:
        gc.unfreeze()
    (finding,) = caught.value.findings
    assert finding.code == "gc-frozen-leak"
    assert finding.details["before"] == at_entry < finding.details["after"]


def test_gc_freeze_undone_inside_the_block_is_clean() -> None:
    with no_leaks():
        gc.freeze()
        gc.unfreeze()


def test_frozen_objects_dying_inside_the_block_are_not_a_leak() -> None:
    doomed = [[] for _ in range(1000)]  # gc-tracked objects
    gc.freeze()  # held by the caller, before the block
    try:
        with no_leaks():
            before = gc.get_freeze_count()
            doomed.clear()  # frozen objects die: the count drops by itself
            assert gc.get_freeze_count() < before
    finally:
        gc.unfreeze()


def test_gc_freeze_check_can_be_switched_off() -> None:
    try:
        with no_leaks(gc_freeze=False):
            gc.freeze()
    finally:
        gc.unfreeze()


# --- several kinds, errors, cost -------------------------------------------------------------


def test_all_kinds_are_reported_together(
    release: threading.Event, procs: list[subprocess.Popen[bytes]]
) -> None:
    try:
        with pytest.raises(ShutdownContractError) as caught, no_leaks(grace=0.2):
            threading.Thread(target=parked_worker, args=(release,)).start()
            procs.append(subprocess.Popen(["sleep", "60"]))
            gc.freeze()
    finally:
        gc.unfreeze()
    assert caught.value.codes == ["thread-leak", "process-leak", "gc-frozen-leak"]


def test_an_exception_from_the_block_propagates_unchanged(release: threading.Event) -> None:
    with pytest.raises(KeyError):
        with no_leaks(grace=0.1):
            threading.Thread(target=parked_worker, args=(release,)).start()
            raise KeyError("from the block")


@pytest.mark.parametrize("grace", [-1.0, float("nan"), float("inf"), True, "2"])
def test_bad_grace_is_rejected_naming_the_argument(grace: object) -> None:
    with pytest.raises(ValueError, match="grace"):
        with no_leaks(grace=grace):  # type: ignore[arg-type]
            pass


def test_bad_allow_rule_is_rejected() -> None:
    with pytest.raises(TypeError, match="allow"):
        thread_filter([42])  # type: ignore[list-item]


def test_started_since_and_without() -> None:
    event = threading.Event()
    before = take_snapshot()
    thread = threading.Thread(target=event.wait, args=(10,))
    thread.start()
    try:
        started = started_since(before)
        assert started.threads == (thread,)
        assert not started.without(threads=[thread])
        assert bool(Started((), (1,)))
    finally:
        event.set()
        thread.join(5)
    assert not await_exit(started, 1.0)


def test_clean_block_is_cheap_and_never_collects_nor_scans_processes() -> None:
    # A fresh interpreter without children, so other tests' processes do not matter.
    code = textwrap.dedent(
        """
        import gc, time, psutil
        from pytest_shutdown.helpers.leaks import no_leaks
        calls = {"collect": 0, "children": 0}
        real_collect, real_children = gc.collect, psutil.Process.children
        def collect(*a):
            calls["collect"] += 1
            return real_collect(*a)
        def children(self, *a, **k):
            calls["children"] += 1
            return real_children(self, *a, **k)
        gc.collect, psutil.Process.children = collect, children
        start = time.perf_counter()
        for _ in range(500):
            with no_leaks():
                pass
        per_block = (time.perf_counter() - start) / 500
        print(calls["collect"], calls["children"], per_block)
        """
    )
    out = fresh_python(code).split()
    assert out[:2] == ["0", "0"]
    assert float(out[2]) < 1e-3  # generous: about 15 us on a laptop


# --- device-memory-held ----------------------------------------------------------------------


class FakeReader:
    """A reader whose readings are scripted; the last one repeats."""

    def __init__(self, name: str, readings: list[int]) -> None:
        self.name = name
        self.readings = list(readings)
        self.calls = 0

    def used_bytes(self) -> int:
        self.calls += 1
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


MIB = 1024 * 1024


def test_device_memory_not_returned_is_device_memory_held() -> None:
    reader = FakeReader("fake-gpu", [5000 * MIB])
    start = time.monotonic()
    with pytest.raises(ShutdownContractError) as caught:
        assert_device_memory_released(
            reader, 1000 * MIB, tolerance_bytes=10 * MIB, timeout=1.0, interval=0.01
        )
    assert time.monotonic() - start < 5.0
    (finding,) = caught.value.findings
    assert finding.code == "device-memory-held"
    assert finding.details["device"] == "fake-gpu"
    assert finding.details["held_bytes"] == 4000 * MIB
    assert finding.details["tolerance_bytes"] == 10 * MIB
    assert "fake-gpu" in finding.message and "4000.0 MiB" in finding.message
    assert reader.calls > 2  # it polled


def test_device_memory_returning_late_within_the_timeout_passes() -> None:
    reader = FakeReader("fake-gpu", [3000 * MIB, 3000 * MIB, 2000 * MIB, 1005 * MIB])
    used = assert_device_memory_released(
        reader, 1000 * MIB, tolerance_bytes=10 * MIB, timeout=10.0, interval=0.01
    )
    assert used == 1005 * MIB


def test_device_memory_within_tolerance_passes_at_once() -> None:
    reader = FakeReader("fake-gpu", [1000 * MIB + 100])
    assert assert_device_memory_released(reader, 1000 * MIB, timeout=10.0) == 1000 * MIB + 100
    assert reader.calls == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"interval": 0}, "interval"),
        ({"tolerance_bytes": -1}, "tolerance_bytes"),
    ],
)
def test_device_memory_bad_arguments_are_rejected(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        assert_device_memory_released(FakeReader("x", [0]), 0, **kwargs)  # type: ignore[arg-type]


def test_process_table_is_rescanned_only_when_a_pid_was_allocated(
    monkeypatch: pytest.MonkeyPatch, procs: list[subprocess.Popen[bytes]], walks: list[int]
) -> None:
    import pytest_shutdown.resources.primitives as leaks

    procs.append(subprocess.Popen(["sleep", "60"]))  # a child exists: waitid cannot rule it out
    scans = walks
    last_pid = [b"100\n"]
    monkeypatch.setattr(leaks, "_last_pid", lambda: last_pid[0])
    first = leaks.descendant_pids()
    assert procs[0].pid in first and len(scans) == 1
    for _ in range(20):
        assert leaks.descendant_pids() == first
    assert len(scans) == 1  # nothing allocated: the last answer stands
    parents = {101: 7, 102: os.getpid()}
    monkeypatch.setattr(leaks, "_parent_of", parents.get)
    last_pid[0] = b"101\n"
    leaks.descendant_pids()
    assert len(scans) == 1  # another process's child: looked up, nothing of ours
    last_pid[0] = b"102\n"
    leaks.descendant_pids()
    assert len(scans) == 2  # a child of this process: walked
    monkeypatch.setattr(leaks, "_last_pid", lambda: None)  # no procfs: always scan
    leaks.descendant_pids()
    leaks.descendant_pids()
    assert len(scans) == 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="walks /proc (Linux)")
def test_descendants_are_walked_from_this_process_not_the_whole_process_table(
    monkeypatch: pytest.MonkeyPatch, procs: list[subprocess.Popen[bytes]]
) -> None:
    import pytest_shutdown.resources.primitives as leaks

    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"])
    procs.append(shell)
    deadline = time.monotonic() + 30
    while len(leaks._walk_descendants(os.getpid()) or ()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    grandchildren = set(psutil.Process(shell.pid).children())
    listed: list[str] = []
    real_listdir = os.listdir

    def listdir(path: str) -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    found = leaks._walk_descendants(os.getpid())
    monkeypatch.undo()
    assert found is not None and shell.pid in found
    assert {p.pid for p in grandchildren} <= found
    assert "/proc" not in listed  # never the host's process table
    assert all(path.startswith("/proc/") and path.endswith("/task") for path in listed)
    for child in grandchildren:
        child.kill()


def test_the_multiprocessing_fork_server_is_not_a_leak_but_its_children_are() -> None:
    # The engine's own context: a plain get_context("forkserver") would start this worker's
    # fork server without the engine's preloads, and every later engine test would pay for it.
    from pytest_shutdown.engine.start import mp_context

    ctx = mp_context("forkserver")
    release = ctx.Event()
    with pytest.raises(ShutdownContractError) as info:
        with no_leaks(threads=False, gc_freeze=False, grace=0.2):
            worker = ctx.Process(target=release.wait, args=(10,), name="fs-child")
            worker.start()
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        leaked = [p["pid"] for f in info.value.findings for p in f.details["processes"]]
        assert worker.pid in leaked
        assert server not in leaked
        # Whether or not the server was started inside this block, it is known as a helper.
        from pytest_shutdown.helpers.leaks import multiprocessing_helper_pids

        assert server in multiprocessing_helper_pids()
    finally:
        release.set()
        worker.join(5)
    with no_leaks(threads=False, gc_freeze=False, grace=2.0):
        other = ctx.Process(target=release.wait, args=(1,))
        other.start()
        other.join(5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="walks /proc (Linux)")
def test_pids_that_went_to_this_process_threads_need_no_walk_and_a_process_still_does(
    procs: list[subprocess.Popen[bytes]], walks: list[int]
) -> None:
    """A test that starts and joins threads moves ns_last_pid by their ids alone: the last
    walk stands. A process of ours started since is walked for; so is a thread still running
    that was started while nothing records the starts (it names this process's parent), not
    one already joined (gone: no descendant of anyone)."""
    import pytest_shutdown.resources.primitives as leaks
    from pytest_shutdown.ownership import origins

    procs.append(subprocess.Popen(["sleep", "60"]))  # a child exists: waitid cannot rule it out
    scans = walks
    a_thread = _start_and_join_a_thread
    origins.install()
    try:
        for _ in range(20):  # other processes of the host allocate pids too: find a quiet run
            first = leaks.descendant_pids()
            scans.clear()
            a_thread()
            a_thread()
            if leaks.descendant_pids() == first and not scans:
                break
        else:
            raise AssertionError("every run of two threads walked again")
        assert procs[0].pid in first
        procs.append(subprocess.Popen(["sleep", "60"]))
        a_thread()
        assert procs[1].pid in leaks.descendant_pids()  # walked: a pid not of a thread of ours
    finally:
        origins.uninstall()
    for _ in range(20):  # (another xdist worker's threads name the same parent: retry)
        scans.clear()
        a_thread()  # not recorded, and gone: its pid is looked up, not walked for
        leaks.descendant_pids()
        if not scans:
            break
    else:
        raise AssertionError("every run of an unrecorded, joined thread walked again")
    release = threading.Event()
    running = threading.Thread(target=release.wait, args=(30,))  # not recorded, running
    running.start()
    try:
        leaks.descendant_pids()
        assert len(scans) == 1
    finally:
        release.set()
        running.join(30)


@pytest.mark.parametrize(
    ("since", "marker", "own"),
    [
        ([101, 102], b"102\n", True),  # both pids went to this process's threads
        ([99, 101], b"102\n", False),  # 102 did not (99 started before the scan's marker)
        ([101], b"102\n", False),  # more pids allocated than threads started
        ([101, 102], b"100\n", False),  # nothing moved, or the pids wrapped around
        ([], b"101\n", False),
        (None, b"101\n", False),  # more threads started than are kept
    ],
)
def test_only_pids_of_this_process_threads_since_the_scan(
    monkeypatch: pytest.MonkeyPatch, since: list[int] | None, marker: bytes, own: bool
) -> None:
    import pytest_shutdown.resources.primitives as leaks
    from pytest_shutdown.ownership import origins

    monkeypatch.setattr(origins, "tids_started_since", lambda count: since)
    assert leaks.nothing_of_ours_since(b"100\n", 0, marker) is own
    monkeypatch.setattr(origins, "tids_started_since", lambda count: None)
    assert leaks.nothing_of_ours_since(b"100\n", 0, marker) is own  # the same question: kept


@pytest.mark.parametrize(
    ("parents", "ours"),
    [
        ({102: 7, 103: 7}, False),  # another process's children: nothing of ours
        ({102: 7, 103: None}, False),  # one of them already gone
        ({102: "this process", 103: 7}, True),  # a child of this process
        ({102: 7, 103: "its parent"}, True),  # a thread of this process names that one
        ({102: 500, 103: 7}, True),  # a descendant's child
        ({102: 7, 103: -1}, True),  # unreadable: not known to be another's
    ],
)
def test_pids_of_other_processes_since_the_scan_are_looked_up_one_by_one(
    monkeypatch: pytest.MonkeyPatch, parents: dict[int, object], ours: bool
) -> None:
    """Thread 101 is this process's; 102 and 103 are looked up: the answer is "nothing of
    ours" only when each is gone or has a parent that is none of ours (descendants: 500)."""
    import pytest_shutdown.resources.primitives as leaks
    from pytest_shutdown.ownership import origins

    named = {"this process": os.getpid(), "its parent": os.getppid()}
    looked_up: list[int] = []

    def parent_of(pid: int) -> int | None:
        looked_up.append(pid)
        parent = parents[pid]
        return named[parent] if isinstance(parent, str) else parent  # type: ignore[return-value]

    monkeypatch.setattr(origins, "tids_started_since", lambda count: [101])
    monkeypatch.setattr(leaks, "_parent_of", parent_of)
    assert leaks.nothing_of_ours_since(b"100\n", 0, b"103\n", frozenset({500})) is not ours
    assert set(looked_up) <= {102, 103} and 101 not in looked_up
    looked_up.clear()
    # without the descendants there is no lookup: a walk answers
    assert leaks.nothing_of_ours_since(b"100\n", 0, b"103\n") is False
    assert looked_up == []


def test_more_pids_of_other_processes_than_the_lookups_ask_for_a_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pytest_shutdown.resources.primitives as leaks
    from pytest_shutdown.ownership import origins

    looked_up: list[int] = []
    monkeypatch.setattr(origins, "tids_started_since", lambda count: [])
    monkeypatch.setattr(leaks, "_parent_of", lambda pid: looked_up.append(pid) or 7)
    most = f"{100 + leaks.FOREIGN_LOOKUPS}\n".encode()
    assert leaks.nothing_of_ours_since(b"100\n", 0, most, frozenset()) is True
    assert len(looked_up) == leaks.FOREIGN_LOOKUPS
    looked_up.clear()
    more = f"{101 + leaks.FOREIGN_LOOKUPS}\n".encode()
    assert leaks.nothing_of_ours_since(b"100\n", 0, more, frozenset()) is False
    assert looked_up == []


def test_with_no_descendant_at_the_last_scan_one_waitid_answers_for_other_pids(
    monkeypatch: pytest.MonkeyPatch, walks: list[int]
) -> None:
    """No descendant then: a pid allocated elsewhere is not looked up, one ``waitid`` (no child
    now) says there is none; a child that appeared since is still walked for."""
    import pytest_shutdown.resources.primitives as leaks

    last_pid = [b"100\n"]
    children = [False]
    looked_up: list[int] = []
    monkeypatch.setattr(leaks, "_last_pid", lambda: last_pid[0])
    monkeypatch.setattr(leaks, "_may_have_children", lambda: children[0])
    monkeypatch.setattr(leaks, "_parent_of", lambda pid: looked_up.append(pid) or 7)
    assert leaks.descendant_pids() == frozenset()
    last_pid[0] = b"101\n"
    assert leaks.descendant_pids() == frozenset()
    assert looked_up == [] and walks == []
    last_pid[0] = b"102\n"
    children[0] = True
    leaks.descendant_pids()
    assert looked_up == [] and walks == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_the_parent_of_a_task_is_read_from_proc() -> None:
    """Real tasks: a child names this process, a thread of this process names its parent, a
    reaped child is gone."""
    import pytest_shutdown.resources.primitives as leaks

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert leaks._parent_of(child.pid) == os.getpid()
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=30)
    assert leaks._parent_of(child.pid) is None
    seen: list[int | None] = []
    thread = threading.Thread(
        target=lambda: seen.append(leaks._parent_of(threading.get_native_id()))
    )
    thread.start()
    thread.join(timeout=30)
    assert seen == [os.getppid()]
