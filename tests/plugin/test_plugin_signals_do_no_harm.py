"""The plugin's signal handling reaches no child and changes nothing a test sees in warn mode
(issue 44, item 2, and "warn mode observes only").

Each shape is a real pytest run, plain, in warn mode and in fail mode: every test's outcome is
plain's. A child forked after a test put SIGTERM back to its default dies of ``terminate()``
with the same caught-signal mask as without the plugin; a child forked in C (below Python's
at-fork hooks) dies of SIGTERM and its signal never ends the run; in warn mode a test finds no
handler and no C-level watch of ours at all.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import select
import signal
import sys
import textwrap
import threading
import time

import pytest

from pytest_shutdown.plugin import interrupts
from pytest_shutdown.plugin.interrupts import _SignalWatch

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/PID/status; SO_PASSCRED"
)

MODES = ("plain", "warn", "fail")


def run_mode(pytester: pytest.Pytester, mode: str, *extra: str) -> pytest.RunResult:
    args = ["-p", "no:randomly", "-p", "no:cacheprovider", "--timeout=60", *extra]
    if mode != "plain":
        args += ["-p", "shutdown", f"--shutdown-guard={mode}", "--shutdown-grace=0.2"]
    return pytester.runpytest_subprocess(*args, timeout=120)


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    found = result.parseoutcomes()
    found.pop("warnings", None)  # warn mode's findings, if any: never an outcome
    found.pop("warning", None)
    return found


# --- a child forked after a test put SIGTERM back to SIG_DFL ----------------------------------

SIG_DFL_THEN_FORK = textwrap.dedent(
    """
    import multiprocessing, pathlib, signal, time

    FORK = multiprocessing.get_context("fork")


    def _wait(ready):
        ready.set()
        time.sleep(60)


    def _caught(pid):
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return line.split()[1]
        raise AssertionError("no SigCgt line")


    def _fork_and_terminate(name):
        ready = FORK.Event()
        proc = FORK.Process(target=_wait, args=(ready,))
        proc.start()
        try:
            assert ready.wait(20), "the child never ran its target"
            pathlib.Path(name).write_text(_caught(proc.pid))
            proc.terminate()
            proc.join(10)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        assert proc.exitcode == -signal.SIGTERM


    def test_sig_dfl_in_the_test_then_fork():
        old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            _fork_and_terminate("in-test.sigcgt")
        finally:
            signal.signal(signal.SIGTERM, old)


    def test_a_later_test_forks():
        # conftest put SIGTERM back to SIG_DFL once the session had started
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        _fork_and_terminate("later-test.sigcgt")
    """
)

SIG_DFL_AT_COLLECTION = textwrap.dedent(
    """
    import signal

    def pytest_collection_finish(session):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    """
)


def test_a_child_forked_after_sigterm_went_back_to_default_dies_of_terminate(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(SIG_DFL_AT_COLLECTION)
    pytester.makepyfile(test_fork=SIG_DFL_THEN_FORK)
    caught: dict[str, dict[str, str]] = {}
    for mode in MODES:
        result = run_mode(pytester, mode)
        assert outcomes(result) == {"passed": 2}, (mode, result.stdout.str())
        caught[mode] = {
            name: (pytester.path / f"{name}.sigcgt").read_text()
            for name in ("in-test", "later-test")
        }
    # The child catches exactly the signals it catches without the plugin (SIGTERM not among
    # them). Signals 32 and up are the C library's own: glibc catches 33 (SIGSETXID) in every
    # process that ever started a thread, as fail mode's watcher thread is; not ours to compare.
    standard = {
        mode: {name: int(mask, 16) & 0x7FFFFFFF for name, mask in masks.items()}
        for mode, masks in caught.items()
    }
    assert standard["warn"] == standard["plain"], caught
    assert standard["fail"] == standard["plain"], caught
    assert not standard["plain"]["in-test"] & (1 << (signal.SIGTERM - 1))


# --- a child forked in C, below Python's at-fork hooks ----------------------------------------

C_FORK_THEN_SIGTERM = textwrap.dedent(
    """
    import ctypes, os, select, signal, time

    # PyDLL keeps the GIL across the call: the child has it (no other thread can hold it).
    _fork = ctypes.PyDLL(None).fork


    def test_c_forked_child_dies_of_sigterm():
        read, write = os.pipe()
        pid = _fork()
        assert pid >= 0
        if pid == 0:  # the child: Python code, but none of the at-fork hooks ran
            try:
                os.close(read)
                os.write(write, b"1")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                os._exit(7)  # SIGTERM did not end it (or it raised): never the test's code
        os.close(write)
        try:
            assert select.select([read], [], [], 20)[0], "the child never reported"
            assert os.read(read, 1) == b"1"
        finally:
            os.close(read)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the C-forked child did not die of SIGTERM")
            time.sleep(0.01)
        assert os.WIFSIGNALED(status), os.waitstatus_to_exitcode(status)
        assert os.WTERMSIG(status) == signal.SIGTERM


    def test_the_session_goes_on():
        # The window in which a watch that took the child's signal for pytest's would end the
        # run (conftest shortened its wait for the main thread): an observation, not a wait for
        # anything.
        time.sleep(1.0)
    """
)

SHORT_TAKE_SIGNAL = textwrap.dedent(
    """
    def pytest_configure(config):
        if config.pluginmanager.has_plugin("shutdown"):
            import pytest_shutdown.plugin.interrupts

            pytest_shutdown.plugin.interrupts.TAKE_SIGNAL_S = 0.2
    """
)


@pytest.mark.parametrize("extra", [(), ("--shutdown-report=r.json",)], ids=["", "report"])
def test_a_child_forked_in_c_dies_of_sigterm_and_does_not_end_the_run(
    pytester: pytest.Pytester, extra: tuple[str, ...]
) -> None:
    pytester.makeconftest(SHORT_TAKE_SIGNAL)
    pytester.makepyfile(test_cfork=C_FORK_THEN_SIGTERM)
    plain = run_mode(pytester, "plain")
    assert plain.ret == 0 and outcomes(plain) == {"passed": 2}, plain.stdout.str()
    for mode in ("warn", "fail"):
        start = time.monotonic()
        result = run_mode(pytester, mode, *extra)
        took = time.monotonic() - start
        out = result.stdout.str() + result.stderr.str()
        assert result.ret == plain.ret, (mode, out)
        assert outcomes(result) == outcomes(plain), (mode, out)
        assert took < 10.0, f"{mode}: the run took {took:.1f} s"
        assert "pytest-shutdown: SIGTERM" not in out, out
        assert "SigtermInterrupted" not in out, out


# --- warn mode: no handler, no watch ----------------------------------------------------------

LOOKS_AT_SIGNALS = textwrap.dedent(
    """
    import faulthandler, pathlib, signal

    def test_sees_python_defaults():
        pathlib.Path("sigcgt").write_text(
            next(
                line.split()[1]
                for line in pathlib.Path("/proc/self/status").read_text().splitlines()
                if line.startswith("SigCgt:")
            )
        )
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # No C-level handler of faulthandler on either (unregister says whether one was there).
        assert not faulthandler.unregister(signal.SIGTERM)
        assert not faulthandler.unregister(signal.SIGINT)
    """
)


@pytest.mark.parametrize("extra", [(), ("--shutdown-report=r.json",)], ids=["", "report"])
def test_warn_mode_installs_no_sigterm_handler_and_no_watch(
    pytester: pytest.Pytester, extra: tuple[str, ...]
) -> None:
    pytester.makepyfile(test_look=LOOKS_AT_SIGNALS)
    plain = run_mode(pytester, "plain")
    assert outcomes(plain) == {"passed": 1}, plain.stdout.str()
    plain_caught = int((pytester.path / "sigcgt").read_text(), 16) & 0x7FFFFFFF
    warn = run_mode(pytester, "warn", *extra)
    assert outcomes(warn) == {"passed": 1}, warn.stdout.str()
    # pytest itself catches what it catches without the plugin (signals 1 to 31: from 32 on
    # they are the C library's own, see above).
    assert int((pytester.path / "sigcgt").read_text(), 16) & 0x7FFFFFFF == plain_caught


def test_fail_mode_still_ends_the_session_in_order_on_sigterm(pytester: pytest.Pytester) -> None:
    """The other side: fail mode keeps its handler (and a guard-off run writing a report)."""
    pytester.makepyfile(
        test_look=textwrap.dedent(
            """
            import signal

            def test_ours_is_there():
                handler = signal.getsignal(signal.SIGTERM)
                assert getattr(handler, "__name__", "") == "_on_sigterm"
            """
        )
    )
    for extra in ((), ("--shutdown-guard=off", "--shutdown-report=r.json")):
        result = pytester.runpytest_subprocess(
            "-p", "shutdown", "-p", "no:randomly", *extra, timeout=120
        )
        assert outcomes(result) == {"passed": 1}, (extra, result.stdout.str())


# --- the watch acts only on signals delivered to its own process ------------------------------


@pytest.mark.skipif(not hasattr(faulthandler, "register"), reason="no signal watch here")
def test_the_watch_ignores_a_signal_a_c_forked_child_got(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked in C inherits the C-level handler and its socket: its dump is not ours.

    The child gets SIGUSR2, this process then SIGUSR1; each watched signal the main thread
    "does not take" is reported after TAKE_SIGNAL_S. The child's would come first.
    """
    monkeypatch.setattr(interrupts, "TAKE_SIGNAL_S", 0.2)
    taken = threading.Event()
    old = {
        s: signal.signal(s, lambda signum, frame: taken.set())
        for s in (signal.SIGUSR1, signal.SIGUSR2)
    }
    ended: list[int] = []
    ended_one = threading.Event()
    watch = _SignalWatch([signal.SIGUSR1, signal.SIGUSR2], lambda status: None)

    def record(signum: int, why: str) -> None:
        ended.append(signum)
        ended_one.set()

    monkeypatch.setattr(watch, "end_at_once", record)
    try:
        read, write = os.pipe()
        pid = ctypes.PyDLL(None).fork()
        if pid == 0:  # pragma: no cover - the child: its dump goes to the watch's socket
            try:
                os.kill(os.getpid(), signal.SIGUSR2)
                os.write(write, b"1")
            finally:
                os._exit(0)
        os.close(write)
        try:
            assert select.select([read], [], [], 20)[0], "the C-forked child never reported"
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ended_one.wait(20), "the watch never noticed this process's own signal"
        # (the recorder does not end the process: the watch reports its signal again and again)
        assert set(ended) == {signal.SIGUSR1}
    finally:
        watch.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
    assert taken.is_set()


# --- a test that asserts its process holds no socket (psutil's test_connections) --------------

HOLDS_NO_SOCKET = textwrap.dedent(
    """
    import os, stat

    def _sockets():
        found = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if stat.S_ISSOCK(os.stat(f"/proc/self/fd/{name}").st_mode):
                    found.append(os.readlink(f"/proc/self/fd/{name}"))
            except OSError:
                continue  # (the listing's own descriptor, closed by now)
        return found

    def test_the_process_holds_no_socket():
        assert _sockets() == []
    """
)


def test_warn_mode_adds_no_socket_to_the_process(pytester: pytest.Pytester) -> None:
    """psutil's ``test_unix_socketpair`` and every ``test_connections`` test (their ``setUp``)
    assert that the process holds no socket at all."""
    pytester.makepyfile(test_sockets=HOLDS_NO_SOCKET)
    for mode in ("plain", "warn"):
        result = run_mode(pytester, mode)
        assert outcomes(result) == {"passed": 1}, (mode, result.stdout.str())


@pytest.mark.xfail(
    strict=True,
    reason="known harm, not fixed: fail mode's signal watch holds a unix datagram socketpair "
    "per watched signal (SO_PASSCRED tells a C-forked child's dump from ours; a pipe cannot)",
)
def test_fail_mode_adds_no_socket_to_the_process(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sockets=HOLDS_NO_SOCKET)
    result = run_mode(pytester, "fail")
    assert outcomes(result) == {"passed": 1}, result.stdout.str()
