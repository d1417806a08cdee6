"""The ports and shm kinds on real sockets, processes and segments."""

from __future__ import annotations

import gc
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from multiprocessing import shared_memory

import pytest

from pytest_shutdown.engine.shm_ring import ShmRing, segment_name, unlink_segment
from pytest_shutdown.ownership.owners import find_owners
from pytest_shutdown.resources import shm as shm_kind
from pytest_shutdown.resources.ports import PortKind, new_ports, take_port_snapshot
from pytest_shutdown.resources.shm import ShmKind, new_segments, take_shm_snapshot

SERVER = (
    "import socket, sys, time\n"
    "s = socket.create_server(('127.0.0.1', 0))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_listening_socket_of_this_process_is_a_port() -> None:
    # the fd kind compares counts first: an earlier test's dropped file closed by a collection
    # between the snapshot and the check would hide one new descriptor; collect first
    # Another descriptor of the xdist worker closed at the same moment can hand the server its
    # number (then not new by number): the block is repeated then, a few times at most.
    gc.collect()
    for _ in range(3):
        before = take_port_snapshot()
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.socket()  # not bound: not a port
        found = new_ports(before)
        if found:
            break
        server.close()
        client.close()
    try:
        (item,) = found
        record = item.record()
        assert record["pid"] == os.getpid() and record["port"] == server.getsockname()[1]
        assert record["what"] == f"TCP socket listening on 127.0.0.1:{record['port']}"
    finally:
        server.close()
        client.close()
    assert PortKind().settle([item], time.monotonic()) == []


def test_a_port_held_by_a_child_started_during_the_block() -> None:
    before = take_port_snapshot()
    child = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        items = new_ports(before)
        assert [(i.pid, i.info.port) for i in items] == [(child.pid, port)]
        (finding,) = PortKind().findings(items, "test_x", grace=1.0)
        assert finding.code == "port-leak"
        assert f"127.0.0.1:{port} held by pid {child.pid}" in finding.message
    finally:
        child.kill()
        child.wait()
    assert PortKind().settle(items, time.monotonic()) == []


def test_a_clean_block_has_no_new_port() -> None:
    before = take_port_snapshot()
    with socket.create_server(("127.0.0.1", 0)):
        pass
    assert new_ports(before) == []


def test_a_segment_created_and_unlinked_is_not_new() -> None:
    before = take_shm_snapshot()
    seg = shared_memory.SharedMemory(create=True, size=4096)
    seg.close()
    seg.unlink()
    assert new_segments(before) == []


def test_a_segment_left_is_named_with_its_size_and_holder() -> None:
    before = take_shm_snapshot()
    seg = shared_memory.SharedMemory(create=True, size=4096)
    try:
        items = new_segments(before)
        assert [i.name for i in items] == [seg.name.lstrip("/")]
        mine, holders = shm_kind.attribute(items, [os.getpid()])
        assert mine == items and holders[items[0].name] == [os.getpid()]
        assert ShmKind().new_since(before) == items
        (record,) = ShmKind().describe(items)
        assert record["size"] == 4096 and f"held by pid {os.getpid()}" in record["what"]
    finally:
        seg.close()
        seg.unlink()
    assert ShmKind().settle(items, time.monotonic()) == []


def _create_and_die(name: str) -> None:
    ring = ShmRing.create(name, slots=2, slot_bytes=64)
    ring.close()
    os._exit(0)  # never unlinks: a SIGKILLed writer


def test_a_dead_descendants_segment_is_ours_and_restore_leaves_it() -> None:
    before = take_shm_snapshot()
    name = segment_name("test")
    child = multiprocessing.get_context("fork").Process(target=_create_and_die, args=(name,))
    child.start()
    child.join(30)
    try:
        # only this test's segment: another xdist worker's tests create theirs meanwhile
        items = [i for i in new_segments(before) if i.name == name]
        assert [i.name for i in items] == [name]
        mine, holders = shm_kind.attribute(items, [os.getpid()])
        assert mine == items and holders[name] == []
        new = ShmKind().new_since(before)  # dead creators included
        assert [i for i in new if i.name == name] == items
        (finding,) = ShmKind().findings(items, "test_x", grace=0.0)
        assert finding.code == "shm-leak" and name in finding.message
        (record,) = ShmKind().describe(items)
        assert record["creator"]["pid"] == os.getpid()  # the name carries who must unlink it
        assert "no process holds it" in record["what"]
        ShmKind().restore(items)  # fail mode never unlinks: the finding says what to clean
        assert os.path.exists(f"/dev/shm/{name}")
    finally:
        unlink_segment(name)


def test_lokys_named_semaphores_are_never_a_tests() -> None:
    """loky's reusable executor keeps its named semaphores for the process (joblib's timeout
    tests left three): never blamed; a segment of the same shape under another name is."""
    before = take_shm_snapshot()
    loky = f"/dev/shm/sem.loky-{os.getpid()}-psdtest"
    other = f"/dev/shm/sem.psd_{os.getpid()}_other"
    for path in (loky, other):
        with open(path, "wb") as f:
            f.write(b"\0" * 32)
    try:
        names = [i.name for i in ShmKind().new_since(before)]
        assert f"sem.psd_{os.getpid()}_other" in names
        assert not any(n.startswith("sem.loky-") for n in names)
    finally:
        for path in (loky, other):
            os.unlink(path)


def test_a_segment_held_only_by_an_outside_process_is_not_ours() -> None:
    before = take_shm_snapshot()
    name = segment_name("outside")
    ring = ShmRing.create(name, slots=1, slot_bytes=64)
    try:
        items = new_segments(before)
        # this process is the "outside" one when the tree is someone else's
        mine, _ = shm_kind.attribute(items, [1])
        assert mine == []
    finally:
        ring.close()
        ring.unlink()


def test_an_unheld_segment_no_pid_ties_to_this_tree_is_not_ours() -> None:
    before = take_shm_snapshot()
    name = f"other_user_process_{os.urandom(4).hex()}"  # another process's, on a shared host
    with open(f"/dev/shm/{name}", "wb") as f:
        f.write(b"x")
    try:
        items = new_segments(before)
        assert [i.name for i in items] == [name]
        assert ShmKind().new_since(before) == []
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_owners_of_a_segment_reached_by_a_module_global() -> None:
    import types

    module = types.ModuleType("shm_global_module")
    sys.modules[module.__name__] = module
    before = take_shm_snapshot()
    module.SEG = shared_memory.SharedMemory(create=True, size=64)  # type: ignore[attr-defined]
    try:
        items = new_segments(before)
        owner = find_owners(ShmKind().targets(items), {})[items[0]]
        assert owner.kind == "module-global" and owner.name == "shm_global_module.SEG"
    finally:
        module.SEG.close()  # type: ignore[attr-defined]
        module.SEG.unlink()  # type: ignore[attr-defined]
        del sys.modules[module.__name__]


def test_the_ring_keeps_order_and_refuses_what_does_not_fit() -> None:
    ring = ShmRing.create(segment_name("unit"), slots=2, slot_bytes=128)
    reader = ShmRing.attach(ring.name)
    try:
        assert ring.put(["a"]) and ring.put(["b"])
        assert not ring.put(["c"])  # full
        assert reader.get_all() == [["a"], ["b"]]
        assert not ring.put("x" * 200)  # larger than a slot
        assert ring.put(["c"]) and reader.get_all() == [["c"]]
    finally:
        reader.close()
        ring.close()
        assert ring.unlink() and not ring.unlink()
    with pytest.raises(ValueError, match="slots/slot_bytes"):
        ShmRing.create(segment_name("bad"), slots=0)


def test_a_pid_ties_a_segment_only_as_a_whole_part_of_its_name() -> None:
    assert shm_kind.named_by("psd_22844_outside_d38f1e7c", [22844])
    assert shm_kind.named_by("sem.loky-4242-x1", [4242])
    # the digits of a random suffix are no pid: "1" and "38" are in d38f1e7c
    assert not shm_kind.named_by("psd_22844_outside_d38f1e7c", [1, 38, 7])
    assert not shm_kind.named_by("psd_122844_ring", [22844])
