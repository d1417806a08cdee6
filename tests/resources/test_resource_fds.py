"""The fds kind and the socket tables: snapshot, diff and description, on real descriptors."""

from __future__ import annotations

import gc
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_shutdown.ownership.owners import find_owners
from pytest_shutdown.resources.fds import FdKind, new_fds, open_fds, settle, take_fd_snapshot
from pytest_shutdown.resources.sockets import read_socket_table, socket_inode

KIND = FdKind()


def _describe(items):  # noqa: ANN001, ANN202
    return {r["fd"]: r for r in KIND.describe(items)}


@pytest.fixture(autouse=True)
def _no_automatic_collection() -> Iterator[None]:
    """An earlier test's garbage, collected mid-test, would close its descriptor and free a
    number the next one opened here takes: that number was open at the snapshot. Collected
    first, and not automatically during the test (``gc.collect()`` still works)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def test_nothing_new_when_a_block_closes_what_it_opens() -> None:
    before = take_fd_snapshot()
    r, w = os.pipe()
    with open(__file__, encoding="utf-8"):
        pass
    os.close(r)
    os.close(w)
    assert new_fds(before) == []


def test_a_snapshot_after_a_test_swapped_descriptors_sees_only_the_next_leak(
    tmp_path: Path,
) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    first = os.open(path, os.O_RDONLY)
    take_fd_snapshot()  # the previous test's snapshot, `first` open
    second = os.open(path, os.O_RDONLY)
    os.close(first)  # that test swapped one descriptor for another: the count is as it was
    before = take_fd_snapshot()
    leaked = os.open(path, os.O_RDONLY)  # most often takes `first`'s number again
    try:
        assert [item.fd for item in new_fds(before)] == [leaked]
    finally:
        os.close(second)
        os.close(leaked)


@pytest.mark.parametrize("gap_below", [False, True])
def test_the_listing_leaves_out_only_its_own_descriptor(tmp_path: Path, gap_below: bool) -> None:
    """``/proc/self/fd`` is listed through a descriptor of its own, closed again: the lowest
    free number, at the top of the numbers from 0 up or (after a close) below others."""
    first = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    second = os.open(tmp_path / "f", os.O_RDONLY)
    if gap_below:
        os.close(first)
    try:
        listed = open_fds()
        assert second in listed and (first in listed) is not gap_below
        for number in listed:
            os.fstat(number)  # each one listed is open
    finally:
        os.close(second)
        if not gap_below:
            os.close(first)


def test_a_pipe_left_open_is_named_by_its_ends() -> None:
    before = take_fd_snapshot()
    r, w = os.pipe()
    try:
        found = _describe(new_fds(before))
        assert set(found) == {r, w}
        assert found[r]["kind"] == "pipe" and "read end" in found[r]["what"]
        assert "write end" in found[w]["what"]
        assert found[r]["opened_by"].startswith("no Python object wraps this pipe")
    finally:
        os.close(r)
        os.close(w)


def test_a_file_is_named_by_its_path_and_the_object_holding_it(tmp_path) -> None:  # noqa: ANN001
    before = take_fd_snapshot()
    path = tmp_path / "data.txt"
    f = open(path, "w", encoding="utf-8")  # noqa: SIM115
    try:
        kind = FdKind()
        (record,) = kind.describe(kind.new_since(before))
        assert record["kind"] == "file" and str(path) in record["what"]
        assert "write" in record["what"]
        assert record["opened_by"] == "held by io.BufferedWriter, io.FileIO, io.TextIOWrapper"
    finally:
        f.close()


def test_sockets_are_named_by_their_addresses() -> None:
    before = take_fd_snapshot()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        found = _describe(new_fds(before))
        port = server.getsockname()[1]
        assert found[server.fileno()]["what"] == f"TCP socket listening on 127.0.0.1:{port}"
        assert found[server.fileno()]["listening"] is True
        what = found[client.fileno()]["what"]
        assert what.startswith("TCP socket 127.0.0.1:") and what.endswith(f"-> 127.0.0.1:{port}")
    finally:
        for s in (accepted, client, server):
            s.close()


def test_udp_ipv6_and_unix_sockets(tmp_path) -> None:  # noqa: ANN001
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp_path / "ctl.sock")
    unix.bind(path)
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind(b"\0pytest-shutdown-test-" + str(os.getpid()).encode())
    socks = [udp, unix, abstract]
    try:
        v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        v6.bind(("::1", 0))
        v6.listen()
        socks.append(v6)
    except OSError:
        v6 = None
    try:
        inodes = {s: socket_inode(os.readlink(f"/proc/self/fd/{s.fileno()}")) for s in socks}
        table = read_socket_table(inodes.values())
        udp_port = udp.getsockname()[1]
        assert table[inodes[udp]].describe() == f"UDP socket bound to 127.0.0.1:{udp_port}"
        assert table[inodes[unix]].local == path and table[inodes[unix]].listening
        assert table[inodes[abstract]].local.startswith("@pytest-shutdown-test-")
        assert all(table[i].bound for i in inodes.values())
        if v6 is not None:
            assert table[inodes[v6]].local == f"[::1]:{v6.getsockname()[1]}"
    finally:
        for s in socks:
            s.close()


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="os.eventfd needs Python 3.10 on Linux")
def test_an_eventfd_and_an_epoll_instance() -> None:
    import select

    before = take_fd_snapshot()
    efd = os.eventfd(0)
    ep = select.epoll()
    try:
        found = _describe(new_fds(before))
        assert found[efd]["what"] == "eventfd"
        assert found[ep.fileno()]["what"] == "epoll instance"
    finally:
        os.close(efd)
        ep.close()


def test_process_lifetime_descriptors_are_never_new() -> None:
    before = take_fd_snapshot()
    fd = os.open("/dev/urandom", os.O_RDONLY)
    try:
        assert new_fds(before) == []
    finally:
        os.close(fd)


def test_settle_collects_a_dropped_socket_and_keeps_a_held_one() -> None:
    before = take_fd_snapshot()
    held = socket.socket()
    socket.socket()  # dropped at once: closed by its finalizer
    dropped_cycle = [socket.socket()]
    dropped_cycle.append(dropped_cycle)  # only gc.collect() closes it
    del dropped_cycle
    items = new_fds(before)
    try:
        left = settle(items, time.monotonic() + 0.2)
        assert [i.fd for i in left] == [held.fileno()]
    finally:
        held.close()
    assert settle(left, time.monotonic()) == []


def test_a_number_reused_by_another_file_is_not_the_same_descriptor(tmp_path) -> None:  # noqa: ANN001
    before = take_fd_snapshot()
    r, w = os.pipe()
    items = [i for i in new_fds(before) if i.fd == r]
    os.close(r)
    reused = os.open(str(tmp_path), os.O_RDONLY)  # the lowest free number: r's
    try:
        assert reused == r
        assert settle(items, time.monotonic()) == []
    finally:
        os.close(reused)
        os.close(w)


def test_a_descriptor_a_test_tool_holds_is_never_new() -> None:
    import _pytest.capture

    before = take_fd_snapshot()
    tool = _pytest.capture.FDCapture(2)  # pytest's own capture: a temporary file it holds
    try:
        assert [i for i in new_fds(before) if i.fd == tool.tmpfile.fileno()]
        left = {i.fd for i in FdKind().new_since(before)}
        assert tool.tmpfile.fileno() not in left
    finally:
        tool.tmpfile.close()
        os.close(tool.targetfd_save)


def test_owners_name_a_module_global() -> None:
    import sys
    import types

    module = types.ModuleType("leaky_global_module")
    sys.modules[module.__name__] = module
    before = take_fd_snapshot()
    module.SOCK = socket.socket()  # type: ignore[attr-defined]
    loose = socket.socket()
    try:
        kind = FdKind()
        items = kind.new_since(before)
        owners = find_owners(kind.targets(items), {})
        by_fd = {item.fd: owner for item, owner in owners.items()}
        fd = module.SOCK.fileno()  # type: ignore[attr-defined]
        assert by_fd[fd].kind == "module-global"
        assert by_fd[fd].name == "leaky_global_module.SOCK"
        assert loose.fileno() not in by_fd
        records = {r["fd"]: r for r in kind.describe(items)}
        assert records[loose.fileno()]["python_objects"] == ["socket.socket"]
    finally:
        module.SOCK.close()  # type: ignore[attr-defined]
        loose.close()
        del sys.modules[module.__name__]


class _NotAFile:
    """A type the heap scan sees for the first time."""


def test_the_heap_scan_finds_file_objects_and_leaves_the_io_abcs_caches_alone(tmp_path) -> None:  # noqa: ANN001
    """Every type of the heap is asked whether it wraps a descriptor: asked through the ``io``
    ABCs, each would cache a weak reference per type for the rest of the session (thousands,
    walked by every full collection)."""
    import abc
    import io

    from pytest_shutdown.resources.fds import wrappers_of

    strangers = [_NotAFile() for _ in range(3)]
    with open(tmp_path / "f", "wb") as handle, socket.socket() as sock:
        found = wrappers_of({handle.fileno(), sock.fileno()})
        assert any(obj is handle for obj in found[handle.fileno()])
        assert any(obj is sock for obj in found[sock.fileno()])
    for base in (io.IOBase, io.RawIOBase, io.BufferedIOBase, io.TextIOBase):
        cached = {ref() for part in abc._get_dump(base)[1:3] for ref in part}  # type: ignore[attr-defined]
        assert _NotAFile not in cached, base
    del strangers


def test_a_descriptor_dropped_in_a_cycle_is_not_new_and_costs_no_heap_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool's pipes dropped in a reference cycle close on a young collection: the kind drops
    them before any heap scan for their wrappers (joblib: 2 s of 9 s went to such scans)."""
    import gc

    from pytest_shutdown.resources import fds

    scans: list[object] = []
    real = fds.wrappers_of
    monkeypatch.setattr(fds, "wrappers_of", lambda wanted: scans.append(wanted) or real(wanted))
    gc.collect()
    before = take_fd_snapshot()
    cycle: list[object] = [socket.socket()]
    cycle.append(cycle)
    del cycle
    assert FdKind().new_since(before) == []
    assert scans == []


def test_a_held_descriptor_beside_a_dropped_one_is_still_new() -> None:
    import gc

    gc.collect()
    before = take_fd_snapshot()
    held = socket.socket()
    cycle: list[object] = [socket.socket()]
    cycle.append(cycle)
    del cycle
    try:
        kind = FdKind()
        items = kind.new_since(before)
        assert [i.fd for i in items] == [held.fileno()]
        assert kind.describe(items)[0]["python_objects"] == ["socket.socket"]
    finally:
        held.close()


def test_settle_collects_a_dropped_socket_in_the_oldest_generation() -> None:
    """Garbage the young collection cannot reach (it survived into the oldest generation) is
    still released by the settle's full collection."""
    import gc

    before = take_fd_snapshot()
    held = socket.socket()
    cycle: list[object] = [socket.socket()]
    cycle.append(cycle)
    gc.collect()  # the cycle, alive, moves to the oldest generation
    del cycle
    items = new_fds(before)
    try:
        assert len(items) == 2
        left = settle(items, time.monotonic() + 0.2)
        assert [i.fd for i in left] == [held.fileno()]
    finally:
        held.close()


@pytest.fixture
def remembered_pool(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A module global that owned a socket once (found by the backward walk, so remembered),
    and a count of the fd kind's heap scans from then on."""
    import sys
    import types

    from pytest_shutdown.ownership import owners
    from pytest_shutdown.resources import fds

    owners.forget_recent_owners()
    module = types.ModuleType("reusable_pool_module")
    sys.modules[module.__name__] = module
    module.POOL = types.SimpleNamespace(socks=[socket.socket()])  # type: ignore[attr-defined]
    first = module.POOL.socks[0]  # type: ignore[attr-defined]
    assert find_owners({first: first}, {})[first].name == "reusable_pool_module.POOL"
    scans: list[object] = []
    real = fds.wrappers_of
    monkeypatch.setattr(fds, "wrappers_of", lambda wanted: scans.append(wanted) or real(wanted))
    yield module, scans
    for sock in module.POOL.socks:  # type: ignore[attr-defined]
        sock.close()
    del sys.modules[module.__name__]
    owners.forget_recent_owners()


def test_a_remembered_owners_new_descriptor_is_new_and_costs_no_heap_scan(
    remembered_pool,  # noqa: ANN001
) -> None:
    """A reusable pool's new pipes, test after test: still reported new (its owner then
    decides whose it is), found forwards from the owner, not by a scan of the heap."""
    from pytest_shutdown._fast.moments import one_moment

    module, scans = remembered_pool
    before = take_fd_snapshot()
    module.POOL.socks.append(socket.socket())
    fd = module.POOL.socks[-1].fileno()
    kind = FdKind()
    with one_moment():
        items = kind.new_since(before)
        assert [i.fd for i in items] == [fd]
        owners = find_owners(kind.targets(items), {})
    assert scans == []
    assert [o.name for o in owners.values()] == ["reusable_pool_module.POOL"]
    assert kind.describe(items)[0]["python_objects"] == ["socket.socket"]


def test_a_descriptor_no_remembered_owner_reaches_is_still_scanned_for(
    remembered_pool,  # noqa: ANN001
) -> None:
    _module, scans = remembered_pool
    before = take_fd_snapshot()
    loose = socket.socket()
    try:
        items = FdKind().new_since(before)
        assert [i.fd for i in items] == [loose.fileno()]
        assert scans  # the heap scan: its wrapper, and whether a test tool holds it
    finally:
        loose.close()


def test_the_long_lived_list_collects_the_whole_heap_only_when_it_fails_the_session(
    remembered_pool,  # noqa: ANN001
) -> None:
    """At session end a remembered owner's descriptor is open for good, no collection asked;
    one an owner dropped into an old cycle is listed after the young collection (it is open),
    and gone once the list would fail the session (the whole heap collected first)."""
    import gc

    module, _scans = remembered_pool
    before = take_fd_snapshot()
    module.POOL.socks.append(socket.socket())
    cycle: list[object] = [socket.socket()]
    cycle.append(cycle)
    gc.collect()  # the cycle, alive, moves to the oldest generation
    dropped_fd = cycle[0].fileno()  # type: ignore[attr-defined]
    del cycle
    items = new_fds(before)
    kept_fd = module.POOL.socks[-1].fileno()
    kind = FdKind()
    listed = kind.settle_long_lived(items, time.monotonic(), thorough=False)
    assert sorted(i.fd for i in listed) == sorted([kept_fd, dropped_fd])
    failing = kind.settle_long_lived(items, time.monotonic(), thorough=True)
    assert [i.fd for i in failing] == [kept_fd]
