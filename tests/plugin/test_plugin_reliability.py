"""Never lost, never hung, never destructive (issue 23): each case a real pytest run, checked
from outside where the claim is about the process (it exits, a file is still a FIFO, the count
is right)."""

from __future__ import annotations

import functools
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from inner_runs import ARGS, finish, load_report, popen_pytest, start_reported_run

from pytest_shutdown.plugin.records import main as assemble_main
from pytest_shutdown.plugin.records import read_entries, record_log_path

# --- item 0: warn mode never fails a test, even under -W error ------------------------------

LEAK = textwrap.dedent(
    """
    import threading
    _release = threading.Event()

    def test_leaks_a_thread():
        threading.Thread(target=_release.wait, name="leaky", daemon=True).start()
    """
)



@pytest.mark.parametrize("errors", ["none", "ini", "W"])
def test_warn_mode_never_fails_a_test_under_filterwarnings_error(
    pytester: pytest.Pytester, errors: str
) -> None:
    pytester.makepyfile(test_leak=LEAK)
    if errors == "ini":
        pytester.makeini("[pytest]\nfilterwarnings =\n    error\n")
    extra = ["-W", "error"] if errors == "W" else []
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-guard=warn", *extra)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*ShutdownLeakWarning*thread-leak*leaky*"])


def test_fail_mode_still_fails_the_leak_under_filterwarnings_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_leak=LEAK)
    pytester.makeini("[pytest]\nfilterwarnings =\n    error\n")
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-guard=fail")
    result.assert_outcomes(passed=1, errors=1)


# --- item 1: SIGTERM / SIGINT end a run stuck in C -------------------------------------------

STUCK_IN_C = textwrap.dedent(
    """
    import ctypes, pathlib, threading

    _release = threading.Event()

    def test_a_finishes_with_a_finding():
        threading.Thread(target=_release.wait, name="leaky", daemon=True).start()

    def test_b_deadlocks_in_c():
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
        libc.pthread_mutex_lock(mutex)
        pathlib.Path("stuck.tmp").write_text(str(ctypes.addressof(mutex)))
        pathlib.Path("stuck.tmp").rename("stuck")  # the address whole, or no file
        libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: never returns
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc pthread mutex")
@pytest.mark.parametrize(
    ("signum", "count", "status", "within"),
    [
        (signal.SIGTERM, 1, 143, 30.0),
        (signal.SIGTERM, 2, 143, 4.5),  # the second SIGTERM ends it at once, not after 5 s
        (signal.SIGINT, 1, 130, 30.0),
    ],
    ids=["sigterm", "sigterm-twice", "sigint"],
)
def test_a_signal_ends_a_run_blocked_in_c(
    pytester: pytest.Pytester, signum: int, count: int, status: int, within: float
) -> None:
    pytester.makepyfile(test_stuck=STUCK_IN_C)
    proc = start_reported_run(pytester, "stuck", "the C deadlock")
    mutex = int((pytester.path / "stuck").read_text())
    _wait_until(proc, lambda: _blocked_on(proc.pid, mutex), "its main thread blocked on the mutex")
    sent = time.monotonic()
    for _ in range(count):
        switches = _voluntary_switches(proc.pid)
        proc.send_signal(signum)
        # Each signal is one: delivered (its C-level handler ran, the dump written), and a thread
        # of the plugin's (the watcher) woke, slept its drain window and waits again.
        _wait_until(proc, lambda: not _pending(proc.pid, signum), f"signal {signum} delivered")
        waiting = functools.partial(_woke_and_waits, proc.pid, switches)
        _wait_until(proc, waiting, "the watcher waiting again")
    returncode, out = finish(proc, timeout=60)
    took = time.monotonic() - sent
    assert returncode == status, out
    assert took < within, f"ended after {took:.1f} s"
    assert f"exit code {status} +++" in out
    report = load_report(pytester)
    assert report["complete"] is False and report["exitstatus"] == status
    codes = {t["nodeid"]: [f["code"] for f in t["findings"]] for t in report["tests"]}
    assert codes == {"test_stuck.py::test_a_finishes_with_a_finding": ["thread-leak"]}


def _wait_until(proc: subprocess.Popen[bytes], ready: Callable[[], bool], what: str) -> None:
    """Polls ``ready`` (with a deadline); the process having ended counts as ready: what it
    printed then tells whether the run went as the test expects."""
    deadline = time.monotonic() + 60
    while not ready():
        if proc.poll() is not None:
            return
        if time.monotonic() > deadline:
            proc.kill()
            out = proc.communicate(timeout=30)[0].decode(errors="replace")
            pytest.fail(f"the inner run never reached {what}:\n{out}")
        time.sleep(0.005)


def _blocked_on(pid: int, address: int) -> bool:
    """Whether thread ``pid`` (a process's main thread) is in a system call whose first argument
    is ``address``: ``futex`` on the mutex's word, the only call taking that address."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()
    except OSError:  # no such file here, or not ours to read: its wait channel then
        try:
            return "futex" in Path(f"/proc/{pid}/task/{pid}/wchan").read_text()
        except OSError:
            return False
    return len(fields) > 1 and fields[0] != "running" and int(fields[1], 16) == address


def _pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits to be delivered to the process or one of its threads."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        masks = [int(line.split()[1], 16) for line in status if line[:6] in ("SigPnd", "ShdPnd")]
    except (OSError, ValueError, IndexError):
        return False
    return any(mask & (1 << (signum - 1)) for mask in masks)


def _thread_states(pid: int) -> dict[int, tuple[str, int]]:
    """tid → (state, voluntary context switches) of every thread of ``pid`` but its main one."""
    found: dict[int, tuple[str, int]] = {}
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task") if int(name) != pid]
    except OSError:
        return found
    for tid in tids:
        try:
            lines = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        found[tid] = (fields["State"].split()[0], int(fields["voluntary_ctxt_switches"]))
    return found


def _voluntary_switches(pid: int) -> dict[int, int]:
    return {tid: switches for tid, (_, switches) in _thread_states(pid).items()}


def _woke_and_waits(pid: int, before: dict[int, int]) -> bool:
    """Whether a thread has blocked twice since ``before`` (woken by the dump, it slept, and
    blocked again) and no thread but the main one runs: the signal's dump was read."""
    now = _thread_states(pid)
    woke = any(switches >= before.get(tid, 0) + 2 for tid, (_, switches) in now.items())
    return woke and all(state == "S" for state, _ in now.values())


# --- item 2: a full disk or a file-size limit does not stop the run ---------------------------

MANY = "\n".join(f"def test_{n}(): pass" for n in range(40))


def _file_size_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))


def test_a_file_size_limit_stops_the_writing_not_the_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_many=MANY)
    proc = popen_pytest(pytester, *ARGS, "--shutdown-report=r.json", preexec_fn=_file_size_limit)
    returncode, out = finish(proc, timeout=120)
    assert returncode == 0, out
    assert "40 passed" in out
    assert "INTERNALERROR" not in out
    assert out.count("shutdown report incomplete") == 1, out
    assert "File too large (EFBIG)" in out
    report = load_report(pytester)  # small enough to be written under the limit
    assert report["complete"] is False and "EFBIG" in report["incomplete"]
    assert report["summary"]["tests"] == 40  # assembled from the records kept in memory
    assert os.path.getsize(record_log_path(pytester.path / "r.json")) <= 3000


def test_a_full_disk_stops_the_writing_not_the_tests(pytester: pytest.Pytester) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    pytester.makeconftest(
        textwrap.dedent(
            """
            import os, pytest

            def pytest_collection_finish(session):
                # The disk is full from here on: the record log's writes fail with ENOSPC.
                log = session.config.pluginmanager.getplugin("pytest-shutdown-report").log
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, log._fd)
                os.close(full)
            """
        )
    )
    pytester.makepyfile(test_many="\n".join(f"def test_{n}(): pass" for n in range(5)))
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json")
    assert result.ret == 0
    result.assert_outcomes(passed=5)
    out = " ".join(result.stdout.str().split())  # the line may be wrapped
    assert out.count("shutdown report incomplete") == 1
    assert "No space left on device (ENOSPC)" in out, out
    report = load_report(pytester)
    assert report["complete"] is False and "ENOSPC" in report["incomplete"]
    assert report["summary"]["tests"] == 5


# --- item 3: an interrupted session is never complete -----------------------------------------

INTERRUPTED = textwrap.dedent(
    """
    import os, signal, time

    def test_a():
        pass

    def test_b_is_interrupted():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    """
)


def test_one_ctrl_c_is_interrupted_not_complete(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_int=INTERRUPTED)
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report = load_report(pytester)
    assert report["complete"] is False and report["interrupted"] is True
    assert report["exitstatus"] == 2


def test_a_second_ctrl_c_during_pytests_interrupt_handling_is_never_complete(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest

            @pytest.hookimpl(tryfirst=True)
            def pytest_keyboard_interrupt(excinfo):
                # The second Ctrl-C, arriving while pytest handles the first one.
                raise KeyboardInterrupt
            """
        )
    )
    pytester.makepyfile(test_int=INTERRUPTED)
    proc = popen_pytest(pytester, *ARGS, "--shutdown-report=r.json")
    returncode, out = finish(proc)
    assert returncode in (130, -signal.SIGINT), out
    report = load_report(pytester)
    assert report["complete"] is False and report["interrupted"] is True
    assert report["exitstatus"] == 130


# --- item 4: under xdist a teardown hung in C keeps its record --------------------------------

HUNG_TEARDOWN = textwrap.dedent(
    """
    import ctypes, pytest

    @pytest.fixture
    def deadlocks_in_teardown():
        yield
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)

    def test_hangs_in_teardown(deadlocks_in_teardown):
        pass

    def test_fine():
        pass
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc pthread mutex")
def test_a_worker_hung_in_c_sends_its_record_to_the_controller(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_hung=HUNG_TEARDOWN)
    result = pytester.runpytest_subprocess(
        *ARGS, "-n", "2", "--shutdown-budget=1", "--shutdown-report=r.json", timeout=120
    )
    assert result.ret != 0
    report = load_report(pytester)
    assert report["complete"] is False
    hung = [t for t in report["tests"] if t["nodeid"].endswith("test_hangs_in_teardown")]
    assert len(hung) == 1, report["tests"]
    assert hung[0]["budget"]["hung"] is True
    assert [f["code"] for f in hung[0]["findings"]] == ["shutdown-budget"]
    assert any("pthread_mutex_lock" in th["stack"] or "deadlocks_in_teardown" in th["stack"]
               for th in hung[0]["budget"]["threads"])
    assert [lost["worker"] for lost in report["lost_workers"]] == [hung[0]["worker"]]
    assert report["lost_workers"][0]["spilled"] >= 1
    result.stdout.fnmatch_lines(["worker gw* ended at once: *the hung test's)"])


# --- item 5: special files are never replaced -------------------------------------------------


def _run_refused(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile("def test_never_runs(): open('ran', 'w').close()")
    result = pytester.runpytest_subprocess("-p", "shutdown", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (pytester.path / "ran").exists()
    return result


def test_a_fifo_report_path_is_refused_and_stays_a_fifo(pytester: pytest.Pytester) -> None:
    fifo = pytester.path / "r.json"
    os.mkfifo(fifo)
    result = _run_refused(pytester, f"--shutdown-report={fifo}")
    result.stderr.fnmatch_lines(["*--shutdown-report*is refused: it exists and is a FIFO*"])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_record_log_path_is_refused(pytester: pytest.Pytester) -> None:
    fifo = record_log_path(pytester.path / "r.json")
    os.mkfifo(fifo)
    result = _run_refused(pytester, "--shutdown-report=r.json")
    result.stderr.fnmatch_lines(["*record log*is a FIFO*"])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_out_of_the_folder_is_never_followed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    link = pytester.path / "r.json"
    link.symlink_to(outside)
    result = _run_refused(pytester, "--shutdown-report=r.json")
    result.stderr.fnmatch_lines(["*is refused: it exists and is a symbolic link*"])
    assert link.is_symlink() and outside.read_text() == "keep me"


def test_the_assembly_command_refuses_special_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "r.records.jsonl"
    log.write_text('{"type": "session", "pid": 1}\n')
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    targets = [fifo] + ([Path("/dev/full")] if os.path.exists("/dev/full") else [])
    for target in targets:
        with pytest.raises(SystemExit) as exited:
            assemble_main([str(log), "-o", str(target)])
        assert exited.value.code == 2
        assert "refused" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if os.path.exists("/dev/full"):
        assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


# --- item 6: a patched Thread.start never reaches the plugin's own threads --------------------


def test_a_patched_thread_start_does_not_break_the_budget(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_patch=textwrap.dedent(
            """
            import threading

            def test_patches_thread_start(monkeypatch):
                started = []
                monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self))
                threading.Thread(target=print)
                assert started == []
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-budget=5")
    result.assert_outcomes(passed=1)
    assert "cannot join thread" not in result.stdout.str()


# --- item 7: two runs on one report path ------------------------------------------------------


def test_a_second_run_on_a_live_runs_report_path_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_slow=textwrap.dedent(
            """
            import pathlib, threading, time

            def test_leaks_then_waits():
                threading.Thread(target=time.sleep, args=(30,), name="leaky", daemon=True).start()

            def test_waits():
                pathlib.Path("first-running").write_text("yes")
                deadline = time.monotonic() + 60
                while not pathlib.Path("second-done").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            """
        )
    )
    first = start_reported_run(pytester, "first-running", "its second test")
    second = subprocess.run(
        [sys.executable, "-m", "pytest", *ARGS, "--shutdown-report=r.json", "test_slow.py"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (pytester.path / "second-done").write_text("yes")
    returncode, out = finish(first)
    assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout + second.stderr
    assert f"in use by another live run (pid {first.pid})" in second.stderr
    assert returncode == 1, out
    report = load_report(pytester)  # the first run's findings are all there
    assert report["complete"] is True and report["summary"]["tests"] == 2
    assert report["summary"]["findings"] == {"thread-leak": 1}


# --- item 9: hostile objects are opaque to the guard ------------------------------------------


def test_objects_whose_class_or_name_raises_are_opaque_to_the_guard(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_hostile=textwrap.dedent(
            """
            import threading

            class Hostile:
                @property
                def __class__(self):
                    raise RuntimeError("no class for you")

            class BadName(threading.Thread):
                @property
                def name(self):
                    raise RuntimeError("no name for you")

                @name.setter
                def name(self, value):
                    pass

            _stop = threading.Event()

            def test_a_hostile_object_holds_a_thread():
                holder = Hostile()
                holder.thread = threading.Thread(target=_stop.wait, daemon=True)
                holder.thread.start()
                test_a_hostile_object_holds_a_thread.keep = holder

            def test_a_thread_whose_name_raises():
                BadName(target=_stop.wait, daemon=True).start()

            def test_after():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json")
    result.assert_outcomes(passed=3, errors=2)
    out = result.stdout.str()
    assert "no class for you" not in out and "no name for you" not in out
    report = load_report(pytester)
    assert report["complete"] is True and report["summary"]["tests"] == 3
    assert report["summary"]["findings"] == {"thread-leak": 2}


# --- item 10: only the session's own process writes the record log ----------------------------


def test_a_forked_child_that_runs_on_writes_nothing(pytester: pytest.Pytester) -> None:
    body = "\n".join(f"def test_{n}(): pass" for n in range(5))
    pytester.makepyfile(
        test_fork=textwrap.dedent(
            """
            import os

            def test_forks_and_the_child_runs_on():
                pid = os.fork()
                if pid == 0:
                    raise RuntimeError("the child raises instead of calling os._exit")
                os.waitpid(pid, 0)
            """
        )
        + "\n"
        + body
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json", timeout=120)
    assert result.ret == 0, result.stdout.str()
    entries = list(read_entries(record_log_path(pytester.path / "r.json")))
    assert sum(1 for e in entries if e["type"] == "end") == 1
    assert sum(1 for e in entries if e["type"] == "session") == 1
    assert sum(1 for e in entries if e["type"] == "record" and e.get("timed")) == 6
    assert load_report(pytester)["summary"]["tests"] == 6


# --- item 0: a thread started by a global pool's manager thread -------------------------------


#: A pool whose manager thread (started with the pool, by test_a) starts a feeder thread for
#: each request; test_mgr.py's tests after test_a_starts_the_pool send it work.
MANAGED_POOL = textwrap.dedent(
    """
    import queue, threading

    class Pool:
        def __init__(self):
            self.requests = queue.Queue()
            self.release = threading.Event()
            self.manager = threading.Thread(
                target=self._manage, name="manager", daemon=True
            )
            self.manager.start()

        def _manage(self):
            while self.requests.get() is not None:
                threading.Thread(
                    target=self.release.wait, name="feeder", daemon=True
                ).start()

    POOL = None

    def test_a_starts_the_pool():
        global POOL
        POOL = Pool()
    """
)


def test_a_thread_started_by_an_older_manager_thread_says_the_test_did_not_start_it(
    pytester: pytest.Pytester,
) -> None:
    """loky's shape: the executor's manager thread (started by an earlier test) starts a feeder
    thread while a later test shuts the executor down without waiting; the finding names the
    manager thread and says that the test did not start it."""
    pytester.makepyfile(
        test_mgr=MANAGED_POOL
        + textwrap.dedent(
            """
            def test_b_shuts_it_down_without_waiting():
                global POOL
                pool, POOL = POOL, None
                pool.requests.put("work")
                pool.requests.put(None)  # shutdown(wait=False): the feeder runs on
                pool.manager.join(5)
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS)
    result.stdout.fnmatch_lines(
        [
            "*thread 'feeder'*",
            "*(from thread 'manager', itself started in test_mgr.py::test_a_starts_the_pool:"
            " the test did not start it)",
        ]
    )


def test_a_global_process_pool_shut_down_without_waiting_is_not_the_tests(
    pytester: pytest.Pytester,
) -> None:
    """The stdlib shape: a ProcessPoolExecutor in a module global, shut down with wait=False by
    a later test. Its threads and process were started by the first test, owned by the global
    then, and are never blamed on the test that shuts the pool down."""
    pytester.makepyfile(
        test_pool=textwrap.dedent(
            """
            import time
            from concurrent.futures import ProcessPoolExecutor

            POOL = ProcessPoolExecutor(1)

            def test_warm():
                assert POOL.submit(abs, -1).result() == 1

            def test_shutdown_without_waiting():
                POOL.submit(time.sleep, 1)
                POOL.shutdown(wait=False)
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json", timeout=120)
    result.assert_outcomes(passed=2)
    report = load_report(pytester)
    assert report["summary"]["findings"] == {}
    assert report["complete"] is True


def test_a_guard_failure_is_recorded_never_the_tests_outcome(pytester: pytest.Pytester) -> None:
    """Should the guard itself fail on a test (here: a Thread subclass whose ``ident`` raises),
    the test passes as it would without the plugin, the record is kept with the guard's error,
    and the report is not complete."""
    pytester.makepyfile(
        test_ident=textwrap.dedent(
            """
            import threading
            _stop = threading.Event()

            class BadIdent(threading.Thread):
                @property
                def ident(self):
                    raise RuntimeError("no ident for you")

            def test_a_thread_whose_ident_raises():
                BadIdent(target=_stop.wait, daemon=True).start()

            def test_after():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*test_a_thread_whose_ident_raises: not checked, the guard failed: RuntimeError: no*"]
    )
    report = load_report(pytester)
    assert report["complete"] is False and "guard failed on 1 test" in report["incomplete"]
    assert report["tests"][0]["guard_error"] == "RuntimeError: no ident for you"


def test_a_thread_started_by_a_global_pools_manager_thread_is_the_pools(
    pytester: pytest.Pytester,
) -> None:
    """Ownership follows a thread through the thread that started it: a feeder thread that
    nothing reaches, started by the manager thread of a pool a module global holds, is the
    pool's (listed as long-lived), not the leak of the test during which it was started."""
    pytester.makepyfile(
        test_mgr=MANAGED_POOL
        + textwrap.dedent(
            """
            def test_b_asks_for_work():
                POOL.requests.put("work")
                deadline = __import__("time").monotonic() + 10
                while not any(t.name == "feeder" for t in threading.enumerate()):
                    assert __import__("time").monotonic() < deadline
            """
        )
    )
    result = pytester.runpytest_subprocess(*ARGS, "--shutdown-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*thread 'feeder' owned by module-global test_mgr.POOL*"])
    report = load_report(pytester)
    assert report["summary"]["findings"] == {}
    feeder = [item for item in report["long_lived"] if item.get("name") == "feeder"]
    assert feeder and "started by its thread 'manager'" in feeder[0]["owner"]["path"]
