"""A forked child inherits nothing of the plugin: SIGTERM kills it as it would without us.

The plugin's SIGTERM handler (the session ends in order) must not survive a fork, or
``Process.terminate()`` exits 1 with a traceback instead of -15 and ``Pool.terminate()`` hangs.
Each case runs plain, in warn mode and in fail mode, and must give the same outcome.
"""

from __future__ import annotations

import textwrap

import pytest

FORKING_TESTS = textwrap.dedent(
    """
    import multiprocessing
    import os
    import select
    import signal
    import subprocess
    import sys
    import threading
    import time

    FORK = multiprocessing.get_context("fork")


    def _sleep():
        time.sleep(60)


    def _ready_then_sleep(ready):
        ready.set()  # past its start-up: the SIGTERM finds the child as a test's code would
        time.sleep(60)


    def _terminated_once_started(ctx, join_s):
        # A child of ctx, terminated once it is past its start-up: its exit code.
        ready = ctx.Event()
        proc = ctx.Process(target=_ready_then_sleep, args=(ready,))
        proc.start()
        assert ready.wait(30), f"the {ctx.get_start_method()} child never started"
        proc.terminate()
        proc.join(join_s)
        return proc.exitcode


    def test_process_terminate_gives_sigterm():
        for _ in range(3):
            assert _terminated_once_started(FORK, 10) == -signal.SIGTERM


    def test_terminate_right_after_start():
        # SIGTERM may arrive before the child ran a single bytecode: still the default action.
        for _ in range(50):
            proc = FORK.Process(target=_sleep)
            proc.start()
            proc.terminate()
            proc.join(10)
            assert proc.exitcode == -signal.SIGTERM


    def test_raw_fork_dies_of_sigterm():
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            # The child reports what it inherited, says it is ready, then waits to be killed.
            handler = signal.getsignal(signal.SIGTERM)
            if handler is not signal.SIG_DFL:
                os._exit(3)
            if threading.Thread.start.__module__ != "threading":
                os._exit(4)
            os.write(write_end, b"r")
            time.sleep(60)
            os._exit(0)
        os.close(write_end)
        try:
            readable, _, _ = select.select([read_end], [], [], 30)
            said = os.read(read_end, 1) if readable else b""
        finally:
            os.close(read_end)
        if said != b"r":  # exited early (3 or 4: it inherited the plugin), or never started
            os.kill(pid, signal.SIGKILL)  # a zombie already, or stuck: reaped either way
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            raise AssertionError(f"the child never got ready (exit status {code})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child ignored SIGTERM")
        assert os.WIFSIGNALED(status), os.waitstatus_to_exitcode(status)
        assert os.WTERMSIG(status) == signal.SIGTERM


    def test_pool_terminate_loop():
        for _ in range(5):
            pool = FORK.Pool(2)
            assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
            pool.terminate()
            pool.join()


    def test_forkserver_child_terminates():
        forkserver = multiprocessing.get_context("forkserver")
        assert _terminated_once_started(forkserver, 20) == -signal.SIGTERM
    """
)


@pytest.mark.parametrize("mode", ["plain", "warn", "fail"])
def test_forked_children_die_of_sigterm_as_without_the_plugin(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makepyfile(test_forking=FORKING_TESTS)
    args = ["-p", "no:randomly", "--timeout=60"]
    if mode != "plain":
        args += ["-p", "shutdown", f"--shutdown-guard={mode}", "--shutdown-grace=0.5"]
    result = pytester.runpytest_subprocess(*args, timeout=120)
    result.assert_outcomes(passed=5)
    out = result.stdout.str()
    assert "SigtermInterrupted" not in out
    assert "process-leak" not in out


def test_the_parent_keeps_its_handler_after_a_fork(pytester: pytest.Pytester) -> None:
    """The undo runs in the child only: the session still ends in order on SIGTERM."""
    pytester.makepyfile(
        test_parent=textwrap.dedent(
            """
            import os, signal

            def test_fork_then_look():
                pid = os.fork()
                if pid == 0:
                    os._exit(0 if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 3)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
                assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", timeout=60)
    result.assert_outcomes(passed=1)


def test_this_pid_follows_a_fork() -> None:
    import os

    from pytest_shutdown._os.forks import this_pid

    assert this_pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        os.write(write, b"1" if this_pid() == os.getpid() != os.getppid() else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(child, 0)
    assert this_pid() == os.getpid()
