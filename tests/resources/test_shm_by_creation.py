"""Segments found by their creation (issue 45, items 1, 2 and 5).

A ``SharedMemory(create=True)`` closed but never unlinked is a test's ``shm-leak`` whatever its
name, named by the line that created it; a segment a descendant created and left when it exited
too; under ``-n 2`` each worker blames only its own. Semaphores and segments a module global (an
executor's call queue) reaches are owned, never blamed. A mock is never an owner. Both sides of
each, as units and as real pytest runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
import types
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any
from unittest.mock import MagicMock

import pytest

from pytest_shutdown import ShutdownContractError
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.owners import find_owners
from pytest_shutdown.resources.check import no_os_leaks
from pytest_shutdown.resources.shm import ShmKind, take_shm_snapshot

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")

#: Every segment these tests (and their inner runs) make starts with this: cleaned up after each.
#: This module's segments, and only its own in this process: the cleanup unlinks what carries
#: the prefix, and the same module runs at once in other xdist workers (one token, no separator:
#: no part of a name that reads as a pid).
PREFIX = "psdcreation" + uuid.uuid4().hex[:8]
GRACE = "--shutdown-grace=0.2"


def _name(tag: str) -> str:
    return f"{PREFIX}_{tag}_{uuid.uuid4().hex}"


def _unlink_ours() -> None:
    for name in os.listdir("/dev/shm"):
        if name.startswith((PREFIX, f"vllm_mm_{PREFIX}")):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


@pytest.fixture(autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    _unlink_ours()


@pytest.fixture
def recording() -> Iterator[None]:
    origins.install()
    try:
        yield
    finally:
        origins.uninstall()


def _forget(seg: shared_memory.SharedMemory) -> None:
    """Unlink a segment the test left on purpose (and let the resource tracker forget it)."""
    with contextlib.suppress(FileNotFoundError):
        seg.unlink()


# --- found by creation ---------------------------------------------------------------------------


def test_a_segment_closed_but_never_unlinked_is_found_with_its_site(recording: None) -> None:
    before = take_shm_snapshot()
    seg = shared_memory.SharedMemory(create=True, size=4096); line = sys._getframe().f_lineno  # noqa: E702
    seg.close()  # never unlinked
    try:
        kind = ShmKind()
        items = kind.new_since(before)
        assert [i.name for i in items] == [seg.name.lstrip("/")]
        (record,) = kind.describe(items)
        assert record["site"] == f"{__file__}:{line}"
        assert record["creator"]["pid"] == os.getpid() and record["holders"] == []
        (finding,) = kind.findings(items, "test_x", grace=0.0)
        assert finding.code == "shm-leak"
        where = os.path.relpath(__file__) if __file__.startswith(os.getcwd()) else __file__
        assert f"created by {sys._getframe().f_code.co_name} at {where}:{line}" in finding.message
    finally:
        _forget(seg)


def test_a_segment_closed_and_unlinked_is_not_found(recording: None) -> None:
    before = take_shm_snapshot()
    seg = shared_memory.SharedMemory(create=True, size=4096)
    seg.close()
    seg.unlink()
    assert ShmKind().new_since(before) == []


def test_a_vllm_named_segment_is_found_by_creation(recording: None) -> None:
    before = take_shm_snapshot()
    name = f"vllm_mm_{PREFIX}_{uuid.uuid4()}"  # vLLM's default name: no pid in it
    seg = shared_memory.SharedMemory(name=name, create=True, size=1024)
    seg.close()
    try:
        items = ShmKind().new_since(before)
        assert [i.name for i in items] == [name]
    finally:
        _forget(seg)


def test_without_recording_an_unheld_segment_is_still_left_out() -> None:
    """The recorder is what ties a closed segment to this process (no guard, no helper: none)."""
    before = take_shm_snapshot()
    name = _name("unrecorded")
    with open(f"/dev/shm/{name}", "wb") as f:  # not a SharedMemory: never recorded
        f.write(b"x")
    assert [i for i in ShmKind().new_since(before) if i.name == name] == []


def test_no_os_leaks_finds_a_closed_segment_and_names_its_site() -> None:
    with pytest.raises(ShutdownContractError) as raised:  # noqa: PT012
        with no_os_leaks(fds=False, ports=False, grace=0):
            seg = shared_memory.SharedMemory(create=True, size=4096); line = sys._getframe().f_lineno  # noqa: E501, E702
            seg.close()
    try:
        assert raised.value.codes == ["shm-leak"]
        (segment,) = raised.value.findings[0].details["segments"]
        assert segment["site"] == f"{__file__}:{line}"
    finally:
        _forget(seg)


def test_no_os_leaks_passes_a_segment_unlinked() -> None:
    with no_os_leaks(fds=False, ports=False, grace=0):
        seg = shared_memory.SharedMemory(create=True, size=4096)
        seg.close()
        seg.unlink()


# --- left by a descendant -----------------------------------------------------------------------


def _create_close_exit(name: str) -> None:
    seg = shared_memory.SharedMemory(name=name, create=True, size=512)
    seg.close()  # never unlinked; the child exits
    os._exit(0)


def _run_child(name: str) -> None:
    child = multiprocessing.get_context("fork").Process(target=_create_close_exit, args=(name,))
    child.start()
    child.join(30)
    assert child.exitcode == 0


def test_a_segment_a_descendant_created_and_left_is_found(recording: None) -> None:
    name = _name("child")
    before = take_shm_snapshot()
    _run_child(name)
    assert [i.name for i in ShmKind().new_since(before) if i.name == name] == [name]


def test_a_segment_named_after_a_running_stranger_is_not_a_descendants(recording: None) -> None:
    """A child of another session's process (its pid in the segment's name, running, not ours)
    made it: this test started a child meanwhile, but the segment is not its descendant's."""
    name = f"{PREFIX}_{os.getppid()}_from_child_{uuid.uuid4().hex}"
    before = take_shm_snapshot()
    _run_child(name)
    assert [i for i in ShmKind().new_since(before) if i.name == name] == []


def test_a_segment_another_recording_process_claims_is_not_found(recording: None) -> None:
    """Another xdist worker's segment (its claim names a pid outside this tree) is not ours,
    even when this test started a child meanwhile."""
    name = _name("claimed")
    before = take_shm_snapshot()
    _run_child(name)
    os.makedirs(origins.claims_dir(), exist_ok=True)
    claim = os.path.join(origins.claims_dir(), name)
    with open(claim, "w") as f:
        f.write("1")  # pid 1: no process of this tree
    try:
        assert [i for i in ShmKind().new_since(before) if i.name == name] == []
    finally:
        os.unlink(claim)


#: A recording process (an xdist worker) that creates a segment, leaves it and ends.
LEAVES_A_SEGMENT = """
import sys
from multiprocessing import resource_tracker, shared_memory
from pytest_shutdown.ownership import origins

origins.install()
seg = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=64)
seg.close()
resource_tracker.unregister(seg._name, "shared_memory")  # left behind, as by a leaky test
origins.uninstall()
"""


def test_a_claim_outlives_its_ended_creator_while_its_segment_is_there() -> None:
    """A worker whose session ended before another's check (its own ran first) still tells
    that one its leaked segment is not a descendant's; a later segment of that name is not its."""
    name = _name("left")
    done = subprocess.run(
        [sys.executable, "-c", LEAVES_A_SEGMENT, name], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    claim = os.path.join(origins.claims_dir(), name)
    try:
        assert origins.segment_claim(name) is not None, "the claim went with its creator"
        old = os.stat(f"/dev/shm/{name}").st_ctime - 10  # as if written for an earlier segment
        os.utime(claim, (old, old))
        assert origins.segment_claim(name) is None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(claim)


def test_a_segment_left_with_no_child_started_is_not_a_descendants(recording: None) -> None:
    name = _name("nochild")
    _run_child(name)  # before the baseline
    os.unlink(f"/dev/shm/{name}")
    before = take_shm_snapshot()
    with open(f"/dev/shm/{name}", "wb") as f:  # appears, but no process of ours started since
        f.write(b"x")
    assert [i for i in ShmKind().new_since(before) if i.name == name] == []


# --- owned ----------------------------------------------------------------------------------------


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("shm_creation_owner")
    sys.modules[mod.__name__] = mod
    try:
        yield mod
    finally:
        del sys.modules[mod.__name__]


def test_a_recorded_segment_a_module_global_reaches_is_owned(
    recording: None, module: Any
) -> None:
    before = take_shm_snapshot()
    module.SEGMENTS = {"ring": shared_memory.SharedMemory(create=True, size=64)}
    try:
        items = ShmKind().new_since(before)
        owners = find_owners({i: o for i, o in ShmKind().targets(items).items()}, {})
        (owner,) = owners.values()
        assert owner.kind == "module-global" and owner.name == "shm_creation_owner.SEGMENTS"
    finally:
        module.SEGMENTS["ring"].close()
        module.SEGMENTS["ring"].unlink()


def test_a_test_local_recorded_segment_has_no_owner(recording: None) -> None:
    before = take_shm_snapshot()
    seg = shared_memory.SharedMemory(create=True, size=64)
    try:
        items = ShmKind().new_since(before)
        targets = ShmKind().targets(items)
        assert list(targets.values()) == [seg]
        assert find_owners(targets, {}) == {}
    finally:
        seg.close()
        seg.unlink()


def test_a_named_semaphore_stands_for_its_semlock_and_a_global_owns_it(module: Any) -> None:
    before = take_shm_snapshot()
    module.LOCK = multiprocessing.get_context("spawn").Lock()  # spawn: the name stays linked
    items = [i for i in ShmKind().new_since(before) if i.name.startswith("sem.")]
    name = "sem." + module.LOCK._semlock.name.lstrip("/")
    assert [i.name for i in items] == [name]
    targets = ShmKind().targets(items)
    assert list(targets.values()) == [module.LOCK]
    (owner,) = find_owners(targets, {}).values()
    assert owner.kind == "module-global" and owner.name == "shm_creation_owner.LOCK"


def test_a_test_local_semaphore_has_no_owner() -> None:
    before = take_shm_snapshot()
    lock = multiprocessing.get_context("spawn").Lock()
    items = [i for i in ShmKind().new_since(before) if i.name.startswith("sem.")]
    targets = ShmKind().targets(items)
    assert list(targets.values()) == [lock]
    assert find_owners(targets, {}) == {}


# --- mocks are never owners ---------------------------------------------------------------------


def test_a_thread_stored_on_a_mock_has_no_owner() -> None:
    release = threading.Event()
    holder = [MagicMock()]
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    holder[0].worker = thread
    holder[0].__aiter__  # noqa: B018 - the auto-made magic methods a mock's class holds
    try:
        assert find_owners({"t": thread}, {}) == {}
    finally:
        release.set()
        thread.join(5)


def test_a_thread_a_module_global_reaches_through_a_mock_is_still_owned(module: Any) -> None:
    """A module global is an owner whatever it holds: only the mock's own class is no root."""
    release = threading.Event()
    module.CLIENT = MagicMock()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    module.CLIENT.worker = thread
    try:
        (owner,) = find_owners({"t": thread}, {}).values()
        assert owner.kind == "module-global" and owner.name.startswith("shm_creation_owner.CLIENT")
    finally:
        release.set()
        thread.join(5)


# --- real pytest runs ---------------------------------------------------------------------------

SUITE = """
import concurrent.futures, multiprocessing, os, subprocess, sys, threading
from multiprocessing import shared_memory
from unittest.mock import MagicMock
import pytest

PREFIX = "{prefix}"
POOL = None
RELEASE = threading.Event()

def pool():
    global POOL
    if POOL is None:  # created in the first test that uses it, kept for the session
        spawn = multiprocessing.get_context("spawn")
        POOL = concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn)
    return POOL

def test_closed_never_unlinked():
    seg = shared_memory.SharedMemory(create=True, size=4096)
    seg.close()

def test_closed_and_unlinked():
    seg = shared_memory.SharedMemory(create=True, size=4096)
    seg.close(); seg.unlink()

def test_vllm_name():
    seg = shared_memory.SharedMemory(name="vllm_mm_" + PREFIX + "_0c5e", create=True, size=64)
    seg.close()

def test_descendant():
    # the child's own resource tracker would unlink it at exit: it unregisters, as engines
    # that manage their segments do (Python 3.13: track=False)
    code = ("from multiprocessing import shared_memory as s, resource_tracker as t; "
            "m = s.SharedMemory(name='" + PREFIX + "_child', create=True, size=64); m.close(); "
            "t.unregister(m._name, 'shared_memory')")
    subprocess.run([sys.executable, "-c", code], check=True)

def test_pool_global_first_use():
    assert pool().submit(abs, -1).result() == 1

def test_pool_global_again():
    assert pool().submit(abs, -2).result() == 2

@pytest.fixture
def client():
    return MagicMock()

def test_thread_on_a_mock(client):
    worker = threading.Thread(target=RELEASE.wait, daemon=True)
    worker.start()
    client.worker = worker

def test_release():
    RELEASE.set()
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_suite=SUITE.replace("{prefix}", PREFIX))
    return pytester


@pytest.mark.long_running(4)
def test_a_real_run_finds_each_leak_by_creation_and_owns_the_pools(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", GRACE)
    out = result.stdout.str()
    errors = {
        line.split("::")[1].split(" ")[0]: line
        for line in out.splitlines()
        if line.startswith("ERROR test_suite.py::")
    }
    assert set(errors) == {
        "test_closed_never_unlinked", "test_vllm_name", "test_descendant", "test_thread_on_a_mock",
    }, out
    assert "shm-leak" in errors["test_closed_never_unlinked"]
    assert "shm-leak" in errors["test_vllm_name"] and "shm-leak" in errors["test_descendant"]
    assert "thread-leak" in errors["test_thread_on_a_mock"]
    source = (suite.path / "test_suite.py").read_text().splitlines()
    line = 1 + source.index("    seg = shared_memory.SharedMemory(create=True, size=4096)")
    assert f"created by test_closed_never_unlinked at test_suite.py:{line}" in errors_text(out), out
    assert "MagicMock" not in out
    assert "sem.mp-" in out and "owned by module-global test_suite.POOL" in out  # listed only
    result.assert_outcomes(passed=8, errors=4)


def errors_text(out: str) -> str:
    """The findings' text: the long lines of the summary."""
    return "\n".join(line for line in out.splitlines() if "shm-leak" in line)


XDIST_SUITE = """
import os, subprocess, sys, time
from multiprocessing import shared_memory

PREFIX = "{prefix}"

def _until_there(name):
    # Each test waits for the other worker's leak (and its claim, written just after it): the
    # one created second appears while the other test runs, however late a busy machine
    # started either worker.
    from pytest_shutdown.ownership import origins
    claim = os.path.join(origins.claims_dir(), name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists("/dev/shm/" + name) and os.path.exists(claim):
            return
        time.sleep(0.02)

def test_worker_a():
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # a child: descendants count
    seg = shared_memory.SharedMemory(name=PREFIX + "_a", create=True, size=64)
    seg.close()
    _until_there(PREFIX + "_b")

def test_worker_b():
    seg = shared_memory.SharedMemory(name=PREFIX + "_b", create=True, size=64)
    seg.close()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    _until_there(PREFIX + "_a")
"""


@pytest.mark.long_running(6)
def test_under_xdist_each_worker_blames_only_its_own(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_two=XDIST_SUITE.replace("{prefix}", PREFIX))
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-p", "no:randomly", "-n", "2", "--dist", "load", GRACE
    )
    out = result.stdout.str()
    result.assert_outcomes(passed=2, errors=2)
    for mine, other in (("a", "b"), ("b", "a")):
        (line,) = [
            text for text in out.splitlines()
            if text.startswith(f"test_two.py::test_worker_{mine} ") and "[shm-leak]" in text
        ]
        assert "1 shared-memory segment " in line and f"{PREFIX}_{mine}," in line, out
        assert f"{PREFIX}_{other}" not in line, out
