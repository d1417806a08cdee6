"""Fingerprints: the guard asks a kind nothing more when its fingerprint did not move, so every
change a kind's ``new_since`` would report must move it (the bug side), and nothing must move it
when nothing changed (the cost side: a clean test stays on the fast path)."""

from __future__ import annotations

import _thread
import atexit
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_shutdown._fast.cheap import lowest_free_fd
from pytest_shutdown._fast.marks import MARKS, FingerprintPass
from pytest_shutdown._fast.moments import one_moment
from pytest_shutdown._os.prctl import PR_SET_NAME, prctl
from pytest_shutdown.resources import default_kinds
from pytest_shutdown.resources.base import ResourceKind

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def _kind(name: str) -> ResourceKind:
    (kind,) = default_kinds([name])
    return kind


def _fingerprint(kind: ResourceKind) -> object:
    with one_moment():  # as the guard reads them
        return kind.fingerprint()


def _moves_and_is_found(name: str, change: Callable[[], object], attempts: int = 1) -> None:
    """``change`` makes something ``name``'s new_since reports: the fingerprint moved.

    A count-first kind (fds, ports) finds nothing when another descriptor of this process was
    closed at the same moment (an xdist worker's earlier tests leave children and pipes that
    end on their own): ``attempts`` repeats the change then, the fingerprint having to move
    every time."""
    kind = _kind(name)
    one_pass = FingerprintPass([kind])  # as the guard reads it: the kind's mark, if it has one
    for _ in range(attempts):
        passed = one_pass.read()
        with one_moment():
            marks, before = kind.fingerprint(), kind.snapshot()
        change()
        assert one_pass.read() != passed
        with one_moment():
            assert kind.fingerprint() != marks
            if kind.new_since(before):
                return
    raise AssertionError(f"{name}: the change was not one new_since reports")


@pytest.fixture
def undo() -> Iterator[list[Callable[[], object]]]:
    undos: list[Callable[[], object]] = []
    yield undos
    for step in reversed(undos):
        step()


def _start_and_join_a_thread() -> None:
    thread = threading.Thread(target=len, args=((),))
    thread.start()
    thread.join()


def _native_thread_starter(undo: list[Callable[[], object]], name: bytes) -> Callable[[], None]:
    """Starts a thread ``threading`` does not know (named, so that no rule for unnamed pool
    workers such as OpenMP's applies), which lives until the test's undo steps run."""
    lock = _thread.allocate_lock()
    lock.acquire()
    undo.append(lock.release)
    named = threading.Event()

    def run() -> None:
        prctl(PR_SET_NAME, name)
        named.set()
        lock.acquire()

    def start() -> None:
        _thread.start_new_thread(run, ())
        assert named.wait(10)

    return start


@pytest.mark.parametrize(
    "name",
    ["threads", "native-threads", "processes", "collateral", "gc-freeze", "fds", "ports", "shm",
     "global-state", "atexit", "process-groups"],
)
def test_nothing_changed_nothing_moves(name: str) -> None:
    """Four readings in a row are equal. The process-wide readings (the fds and ports kinds
    count every descriptor of the xdist worker) can move once when something of the worker's
    own ends beside the test (a child of an earlier test reaped, a pipe closed by a
    collection): a later run of four readings must then be equal. A fingerprint that its own
    reading moves (the folder's descriptor counted, say) never gets four equal ones."""
    kind = _kind(name)
    readings = [_fingerprint(kind) for _ in range(4)]
    for _ in range(20):
        if all(reading == readings[-1] for reading in readings[-4:]):
            return
        time.sleep(0.01)
        readings.append(_fingerprint(kind))
    raise AssertionError(f"{name}: the fingerprint moved with nothing changed: {readings}")


@pytest.fixture
def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What moves a reading besides the test, taken out: ``/dev/shm`` (every process of the host
    writes there) is a folder of the test's own, and no collection runs (its finalizers close
    the worker's descriptors and reap its children at any allocation). Pids other processes
    allocate still move ``ns_last_pid``: :meth:`FingerprintPass.moved` tells those apart, as
    the guard does, so each reading pair is compared through it."""
    from pytest_shutdown._fast import marks  # noqa: PLC0415

    monkeypatch.setattr(marks, "SHM_DIR", str(tmp_path))
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("quiet")
def test_nothing_changed_nothing_moves_the_one_pass_reading() -> None:
    """The guard's one-pass reading of every kind: no kind moved, every time."""
    one_pass = FingerprintPass(default_kinds())
    _each_unmoved_or_foreign(one_pass, lambda: (one_pass.read(), one_pass.read()))


@pytest.mark.usefixtures("quiet")
def test_a_scan_of_the_descendants_does_not_move_the_one_pass_reading() -> None:
    """The collateral kind's mark is read from the last scan of the descendants when there was
    one at this ``ns_last_pid``, else asked of the kind (which scans): both must give the same
    marks, or every check that had to scan would make the next test take a fresh baseline."""
    one_pass = FingerprintPass(default_kinds())

    def scan_then_read() -> tuple[list[object], list[object]]:
        _start_and_join_a_thread()  # a tid allocated: no scan at this ns_last_pid yet
        first = one_pass.read()  # asks the kind (a scan)
        return first, one_pass.read()  # read from that scan

    _each_unmoved_or_foreign(one_pass, scan_then_read)


def _each_unmoved_or_foreign(
    one_pass: FingerprintPass, readings: Callable[[], tuple[list[Any], list[Any]]]
) -> None:
    """Twenty pairs of readings: each pair moved no kind, or only kinds read through
    ``ns_last_pid`` when a task that is not a thread of ours was created in between (the other
    xdist worker's threads name our parent as theirs, so the guard cannot tell them apart: it
    asks those kinds, which costs time, never a finding). Anything else fails at once; and at
    least one pair moved nothing."""
    at = one_pass._marker_at
    assert at is not None or not sys.platform.startswith("linux")
    through_last_pid = set(one_pass._owners[at]) if at is not None else set()
    clean = 0
    for _ in range(20):
        before, after = readings()
        moved = one_pass.moved(before, after)
        if moved == set():
            clean += 1
            continue
        assert at is not None and moved is not None and moved <= through_last_pid, (before, after)
        allocated = int(after[at]) - int(before[at])
        assert allocated > after[at + 1] - before[at + 1], f"only our threads: {before}, {after}"
    assert clean, "no pair of readings moved nothing"


@linux_only
def test_the_collateral_mark_with_a_child_is_what_the_kind_answers(
    undo: list[Callable[[], object]],
) -> None:
    """With descendants, the pass reads the collateral kind's mark from the last scan and one
    ``waitid`` instead of asking the kind: it must be the very value the kind answers."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    undo.append(lambda: (child.kill(), child.wait()))
    kind = _kind("collateral")
    one_pass = FingerprintPass([kind])
    for _ in range(20):
        with one_moment():
            expected = kind.fingerprint()  # a scan at this ns_last_pid, the child in it
        if one_pass.read()[-1] == expected:  # after ns_last_pid and the threads started
            return
        time.sleep(0.01)  # another process of the host allocated a pid meanwhile: again
    raise AssertionError("the collateral mark is not what the kind answers")


def _moved_by(change: Callable[[], object]) -> set[str] | None:
    """The kinds ``change`` moved (under the ``quiet`` fixture: nothing else moves them)."""
    one_pass = FingerprintPass(default_kinds())
    before = one_pass.read()
    change()
    return one_pass.moved(before, one_pass.read())


@pytest.mark.usefixtures("quiet")
def test_moved_names_the_kinds_behind_the_readings_that_moved(
    undo: list[Callable[[], object]],
) -> None:
    """The guard asks only the kinds whose readings moved: a freeze is the gc-freeze kind's
    alone, a thread the threads kind's (and, its task allocated, those read through
    ns_last_pid); nothing moved, no kind."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(10,))
    undo.append(lambda: (stop.set(), thread.join(5)))
    moved = _moved_by(thread.start)
    assert moved is not None and "threads" in moved and "gc-freeze" not in moved
    if sys.platform.startswith("linux"):
        assert {"native-threads", "processes"} <= moved
    # Nothing changed: no kind, every time (pids other processes allocated are told apart).
    # Before the freeze: a frozen object that dies lowers the freeze count.
    one_pass = FingerprintPass(default_kinds())
    _each_unmoved_or_foreign(one_pass, lambda: (one_pass.read(), one_pass.read()))
    undo.append(gc.unfreeze)
    moved = _moved_by(gc.freeze)
    assert moved is not None and "gc-freeze" in moved and "threads" not in moved


@linux_only
@pytest.mark.usefixtures("quiet")
def test_a_joined_thread_of_this_process_moves_no_kind_and_a_process_does(
    undo: list[Callable[[], object]],
) -> None:
    """ns_last_pid moved only by threads this process started (and joined): no kind read
    through it is asked; a process started beside them is still the processes kind's."""
    from pytest_shutdown.ownership import origins

    a_thread = _start_and_join_a_thread
    origins.install()
    undo.append(origins.uninstall)
    one_pass = FingerprintPass(default_kinds())

    def around_a_thread() -> tuple[list[Any], list[Any]]:
        before = one_pass.read()
        a_thread()
        return before, one_pass.read()

    _each_unmoved_or_foreign(one_pass, around_a_thread)
    procs: list[subprocess.Popen[bytes]] = []
    undo.append(lambda: [(p.kill(), p.wait()) for p in procs])

    def a_thread_and_a_process() -> None:
        a_thread()
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))

    moved = _moved_by(a_thread_and_a_process)
    assert moved is not None and "processes" in moved


def test_moved_is_every_kind_when_the_readings_differ_in_shape() -> None:
    one_pass = FingerprintPass(default_kinds())
    marks = one_pass.read()
    assert one_pass.moved(marks, marks[:-1]) is None
    assert one_pass.moved(marks, list(marks)) == set()


class _MarkedOnly:
    """A kind whose fingerprint must not be asked: its mark stands for it."""

    name = "marked-only"
    mark_reading = staticmethod(lambda: 0)  # the call the "atexit_count" and "c10d" marks make

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def fingerprint(self) -> object:
        raise AssertionError(f"asked for the fingerprint its mark {self.mark!r} stands for")


@pytest.mark.parametrize("mark", [m for m in MARKS if m != "childless"])
def test_a_marked_kind_is_not_asked_for_its_fingerprint(mark: str) -> None:
    if mark in ("last_pid", "fd_count") and not sys.platform.startswith("linux"):
        pytest.skip("reads /proc (Linux)")  # elsewhere the kind's own fingerprint is asked
    assert len(FingerprintPass([_MarkedOnly(mark)]).read()) >= 1


def test_a_kind_without_a_mark_is_asked() -> None:
    kind = _kind("global-state")
    assert getattr(kind, "mark", None) is None
    assert FingerprintPass([kind]).read() == [kind.fingerprint()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_its_own_descriptors() -> None:
    """The pass's held files are the parent's: a forked child closes them and must open its
    own, not read whatever descriptor took their numbers (here: the root folder, whose size
    does not move when the child opens a file)."""
    one_pass = FingerprintPass(default_kinds(["fds", "native-threads"]))
    one_pass.read()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            for _ in range(32):  # the lowest numbers, the parent's closed ones among them
                os.open("/", os.O_RDONLY)
            first = one_pass.read()
            handle = os.open(os.devnull, os.O_RDONLY)
            moved = one_pass.read() != first
            os.close(handle)
            os.write(write_end, b"moved" if moved else b"still")
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        answer = os.read(read_end, 16)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert answer == b"moved"


def test_the_ports_fingerprint_is_the_fds_and_processes_fingerprints() -> None:
    """The guard skips the ports kind's fingerprint while the kinds it names in
    ``fingerprinted_by`` are on: that holds only while it is made of their readings."""
    ports = _kind("ports")
    assert ports.fingerprinted_by == ("fds", "processes")  # type: ignore[attr-defined]
    with one_moment():
        assert ports.fingerprint() == (_kind("fds").fingerprint(), _kind("processes").fingerprint())


@linux_only
def test_the_ports_kind_is_unmoved_by_a_pid_taken_and_given_back_and_moved_by_a_new_child() -> None:
    """The processes kind's reading (``ns_last_pid``) moves with every pid allocated anywhere;
    the ports kind, fingerprinted by it, asks whether the descendants are still the baseline's:
    a child started and reaped leaves them so, a child still running does not, and a moved fd
    fingerprint always counts as moved."""
    ports = _kind("ports")
    unmoved = ports.unmoved_since  # type: ignore[attr-defined]
    for _ in range(5):  # an earlier test's child (xdist) may end meanwhile: that moves them too
        with one_moment():
            before = ports.snapshot()
        subprocess.run(["true"], check=True)
        if unmoved(before, {"processes"}):
            break
    else:
        pytest.fail("a child started and reaped moved the ports kind five times in a row")
    assert not unmoved(before, {"fds", "processes"})
    with one_moment():
        before = ports.snapshot()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert not unmoved(before, {"processes"})
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_a_thread_started_moves_the_threads_fingerprint(undo: list[Callable[[], object]]) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(10,))
    undo.append(lambda: (stop.set(), thread.join(5)))
    _moves_and_is_found("threads", thread.start)


@linux_only
def test_a_native_thread_moves_the_native_fingerprint(undo: list[Callable[[], object]]) -> None:
    _moves_and_is_found("native-threads", _native_thread_starter(undo, b"fingerprinted"))


@linux_only
def test_threads_this_process_started_need_no_listing_and_a_native_one_is_found(
    monkeypatch: pytest.MonkeyPatch, undo: list[Callable[[], object]]
) -> None:
    """After a snapshot, tasks that are all threads started through ``threading`` (recorded
    by origins) need no listing of ``/proc/self/task``; a native thread started beside them is
    still listed and found."""
    from pytest_shutdown.ownership import origins

    kind = _kind("native-threads")
    listings: list[int] = []
    real_tids = kind._tids  # type: ignore[attr-defined]
    monkeypatch.setattr(kind, "_tids", lambda: listings.append(1) or real_tids())

    a_thread = _start_and_join_a_thread
    origins.install()
    undo.append(origins.uninstall)
    for _ in range(20):  # other processes of the host allocate pids too: find a quiet run
        before = kind.snapshot()
        listings.clear()
        a_thread()
        a_thread()
        if kind.new_since(before) == () and not listings:
            break
    else:
        raise AssertionError("every run of two threads listed the tasks")
    start_a_native_thread = _native_thread_starter(undo, b"not-recorded")
    before = kind.snapshot()
    a_thread()
    start_a_native_thread()
    assert len(kind.new_since(before)) == 1


def test_a_child_process_moves_the_processes_fingerprint(
    undo: list[Callable[[], object]],
) -> None:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))

    undo.append(lambda: [(p.kill(), p.wait(10)) for p in procs])
    _moves_and_is_found("processes", start)


def test_a_killed_bystander_moves_the_collateral_fingerprint(
    undo: list[Callable[[], object]],
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    undo.append(lambda: (proc.kill(), proc.wait(10)))
    deadline = time.monotonic() + 10
    while _kind("collateral").snapshot() == frozenset() and time.monotonic() < deadline:
        time.sleep(0.01)

    def kill() -> None:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"/proc/{proc.pid}") or _state(proc.pid) != "Z":
            if time.monotonic() > deadline:
                raise AssertionError("the bystander did not become a zombie")
            time.sleep(0.01)

    _moves_and_is_found("collateral", kill)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_a_freeze_moves_the_freeze_fingerprint(undo: list[Callable[[], object]]) -> None:
    undo.append(gc.unfreeze)
    _moves_and_is_found("gc-freeze", gc.freeze)


@linux_only
def test_an_open_file_moves_the_fd_fingerprint(
    tmp_path: Path, undo: list[Callable[[], object]]
) -> None:
    fds: list[int] = []
    undo.append(lambda: [os.close(fd) for fd in fds])
    _moves_and_is_found(
        "fds", lambda: fds.append(os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)), attempts=3
    )


@linux_only
def test_a_descriptor_swapped_for_another_moves_the_fd_fingerprint(
    tmp_path: Path, undo: list[Callable[[], object]]
) -> None:
    """One opened, one the test had not opened closed: the count is as it was, the lowest free
    number is not, and the new one is found."""
    path = tmp_path / "f"
    path.write_bytes(b"")
    older = os.open(path, os.O_RDONLY)
    opened: list[int] = []
    undo.append(lambda: [os.close(fd) for fd in opened])

    def swap() -> None:
        opened.append(os.open(path, os.O_RDONLY))
        os.close(older)

    _moves_and_is_found("fds", swap)


@linux_only
def test_the_lowest_free_descriptor_is_the_next_one_opened(tmp_path: Path) -> None:
    expected = lowest_free_fd()
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    try:
        assert fd == expected
        assert lowest_free_fd() != fd
    finally:
        os.close(fd)
    assert lowest_free_fd() == expected


@linux_only
def test_a_listening_socket_moves_the_ports_fingerprint(
    undo: list[Callable[[], object]],
) -> None:
    sockets: list[socket.socket] = []

    def listen() -> None:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        sockets.append(server)

    undo.append(lambda: [s.close() for s in sockets])
    _moves_and_is_found("ports", listen, attempts=3)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_a_segment_moves_the_shm_fingerprint(undo: list[Callable[[], object]]) -> None:
    path = Path("/dev/shm") / f"psd_fingerprint_{uuid.uuid4().hex[:8]}"
    undo.append(lambda: path.unlink(missing_ok=True))
    handle: list[int] = []
    undo.append(lambda: [os.close(fd) for fd in handle])
    _moves_and_is_found("shm", lambda: handle.append(os.open(path, os.O_CREAT | os.O_RDWR)))


@pytest.mark.parametrize("what", ["signal", "environ", "excepthook"])
def test_process_wide_state_moves_the_global_state_fingerprint(
    what: str, undo: list[Callable[[], object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    if what == "signal":
        previous = signal.getsignal(signal.SIGUSR1)
        undo.append(lambda: signal.signal(signal.SIGUSR1, previous))
        change: Callable[[], object] = lambda: signal.signal(signal.SIGUSR1, lambda *a: None)  # noqa: E731
    elif what == "environ":
        change = lambda: monkeypatch.setenv("FINGERPRINT_CHECK_X", "1")  # noqa: E731
    else:
        change = lambda: monkeypatch.setattr(sys, "excepthook", lambda *a: None)  # noqa: E731
    _moves_and_is_found("global-state", change)


def test_an_atexit_registration_moves_the_atexit_fingerprint(
    undo: list[Callable[[], object]],
) -> None:
    class Held:
        def close(self) -> None:
            pass

    held = Held()
    undo.append(lambda: atexit.unregister(held.close))
    kind = _kind("atexit")  # installs the recorder, as the guard does
    undo.append(kind.close)
    with one_moment():
        marks, before = kind.fingerprint(), kind.snapshot()
    atexit.register(held.close)
    with one_moment():
        assert kind.fingerprint() != marks
        assert kind.new_since(before)


def _tool_handler() -> Callable[..., None]:
    """A new handler per call, from a test tool's module (pytest-timeout's shape: a closure
    installed before every test's set-up)."""

    def handler(*args: object) -> None:
        pass

    handler.__module__ = "pytest_timeout"
    return handler


def test_a_test_tools_new_handler_per_test_does_not_move_the_fingerprint_and_a_tests_does(
    undo: list[Callable[[], object]],
) -> None:
    kind = _kind("global-state")
    alarm, usr2 = signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGUSR2)
    undo.append(lambda: signal.signal(signal.SIGALRM, alarm))
    undo.append(lambda: signal.signal(signal.SIGUSR2, usr2))
    signal.signal(signal.SIGALRM, _tool_handler())
    first = kind.fingerprint()
    signal.signal(signal.SIGALRM, _tool_handler())
    assert kind.fingerprint() == first
    signal.signal(signal.SIGUSR2, lambda *a: None)  # the test's own: it moves
    signal.signal(signal.SIGALRM, _tool_handler())  # and the tool's again, at once
    moved = kind.fingerprint()
    assert moved != first
    signal.signal(signal.SIGUSR2, usr2)
    signal.signal(signal.SIGALRM, alarm)  # the tool's handler gone: what was there before
    assert kind.fingerprint() != moved
