"""Ownership and creation sites, as plain functions (the guard's end-to-end tests are in
tests/plugin/test_plugin_ownership.py)."""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_shutdown import _FROZEN_AT_IMPORT
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.owners import (
    find_owners,
    forget_recent_owners,
    stdlib_helper_threads,
)


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    """A throw-away module in sys.modules, for module globals."""
    mod = types.ModuleType("ownership_subject")
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


@pytest.fixture
def recording() -> Iterator[None]:
    origins.install()
    yield
    origins.uninstall()


def _workers(pool: ThreadPoolExecutor) -> list[threading.Thread]:
    pool.submit(abs, -1).result()
    return list(pool._threads)


def test_a_module_global_pool_owns_its_workers(module: types.ModuleType) -> None:
    module.POOL = ThreadPoolExecutor(1)
    try:
        (worker,) = _workers(module.POOL)
        owner = find_owners({worker: worker}, {})[worker]
        assert (owner.kind, owner.name) == ("module-global", "ownership_subject.POOL")
        assert owner.path == ".POOL._threads{item}"
    finally:
        module.POOL.shutdown()


def test_a_class_attribute_owns_its_pool() -> None:
    class Service:
        pool = ThreadPoolExecutor(1)

    try:
        (worker,) = _workers(Service.pool)
        owner = find_owners({worker: worker}, {})[worker]
        assert owner.kind == "class-attribute"
        assert owner.name.endswith("Service.pool")
    finally:
        Service.pool.shutdown()


def test_a_fixture_value_owns_what_it_holds() -> None:
    value = {"engine": types.SimpleNamespace(pool=ThreadPoolExecutor(1))}
    try:
        (worker,) = _workers(value["engine"].pool)
        owner = find_owners({worker: worker}, {id(value): ("key", "'engine'", value)})[worker]
        assert (owner.kind, owner.key) == ("fixture", "key")
    finally:
        value["engine"].pool.shutdown()


@pytest.mark.parametrize("shortcut", [True, False], ids=["forwards", "backwards"])
def test_the_ray_cluster_fixtures_value_owns_the_replacement_node_it_holds(shortcut: bool) -> None:
    """The ``ray_cluster`` fixture's value is walked through like an engine's, not skipped as
    the plugin's own bookkeeping: the replacement node's process (``restore()``) is the
    fixture's, not the test's that called it."""
    from pytest_shutdown.plugin.ray_cluster import NodeProcess, RayCluster  # noqa: PLC0415

    process = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        value = RayCluster(None, "127.0.0.1:0", {}, [NodeProcess(process, "node")])
        roots = {id(value): ("key", "'ray_cluster' (session scope)", value)}
        owner = find_owners({"node": process}, roots, shortcut=shortcut)["node"]
        assert (owner.kind, owner.key, owner.path) == (
            "fixture", "key", ".worker_nodes[0].process"
        )
    finally:
        process.kill()
        process.wait(10)


def test_a_thread_in_a_local_and_a_dropped_object_are_unowned() -> None:
    stop = threading.Event()
    holder = types.SimpleNamespace()  # only a local holds it: not an owner
    holder.thread = threading.Thread(target=stop.wait, daemon=True)
    holder.thread.start()
    try:
        # threading._active, the thread's own frames and the walk's bookkeeping own nothing.
        assert find_owners({holder.thread: holder.thread}, {}) == {}
    finally:
        stop.set()
        holder.thread.join(10)


def test_frozen_owners_are_found_forwards(module: types.ModuleType) -> None:
    if gc.get_freeze_count() > _FROZEN_AT_IMPORT:  # the interpreter's own: 375 on 3.12.1
        pytest.skip("a freeze is already in place")  # never the case under this suite
    module.POOL = ThreadPoolExecutor(1)
    worker = _workers(module.POOL)[0]
    gc.freeze()  # the pool's objects become invisible to gc.get_referrers
    try:
        owner = find_owners({worker: worker}, {})[worker]
        assert (owner.kind, owner.name) == ("module-global", "ownership_subject.POOL")
    finally:
        gc.unfreeze()
        module.POOL.shutdown()


def test_a_walk_that_gives_up_leaves_the_target_unowned(module: types.ModuleType) -> None:
    module.POOL = ThreadPoolExecutor(1)
    try:
        (worker,) = _workers(module.POOL)
        assert find_owners({worker: worker}, {}, max_depth=1) == {}
    finally:
        module.POOL.shutdown()


@pytest.fixture
def heap_passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The backward walk's heap passes (``gc.get_referrers`` calls), counted; no owner
    remembered from another test."""
    forget_recent_owners()
    calls: list[int] = []
    real = gc.get_referrers

    def counted(*objs: object) -> list[object]:
        calls.append(len(objs))
        return real(*objs)

    monkeypatch.setattr(gc, "get_referrers", counted)
    yield calls
    forget_recent_owners()


class _Executor:
    """A reusable executor: new workers test after test."""

    def __init__(self) -> None:
        self.threads: set[threading.Thread] = set()
        self._stop = threading.Event()

    def spawn(self) -> threading.Thread:
        thread = threading.Thread(target=self._stop.wait, daemon=True)
        self.threads.add(thread)
        thread.start()
        return thread

    def shutdown(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(10)


def test_a_remembered_module_global_owns_its_new_workers_without_a_heap_pass(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """A reusable executor's new workers, test after test: the global that owned the first
    one is searched forwards first."""
    module.POOL = _Executor()
    try:
        first = module.POOL.spawn()
        assert find_owners({first: first}, {})[first].name == "ownership_subject.POOL"
        assert heap_passes  # the first time: the backward walk
        heap_passes.clear()
        second = module.POOL.spawn()
        owner = find_owners({second: second}, {})[second]
        assert (owner.kind, owner.name) == ("module-global", "ownership_subject.POOL")
        assert owner.path == ".POOL.threads{item}"
        assert heap_passes == []
    finally:
        module.POOL.shutdown()


def test_a_remembered_class_attribute_owns_its_new_workers_without_a_heap_pass(
    heap_passes: list[int],
) -> None:
    class Monitor:
        pool = _Executor()

    try:
        first = Monitor.pool.spawn()
        assert find_owners({first: first}, {})[first].kind == "class-attribute"
        heap_passes.clear()
        second = Monitor.pool.spawn()
        owner = find_owners({second: second}, {})[second]
        assert owner.kind == "class-attribute"
        assert owner.name.endswith("Monitor.pool")
        assert owner.path.endswith(".threads{item}")
        assert heap_passes == []
    finally:
        Monitor.pool.shutdown()


def test_what_a_remembered_global_does_not_reach_is_still_unowned(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """The executor replaced (the old one dropped with its worker still running) and a thread
    only a local holds: neither is the global's."""
    module.POOL = _Executor()
    old_pool = module.POOL
    loose = _Executor()
    try:
        old = module.POOL.spawn()
        assert find_owners({old: old}, {})[old].name == "ownership_subject.POOL"
        module.POOL = _Executor()
        module.POOL.spawn()
        other = loose.spawn()
        heap_passes.clear()
        assert find_owners({old: old, other: other}, {}) == {}
        assert heap_passes  # decided by the backward walk
    finally:
        loose.shutdown()
        old_pool.shutdown()
        module.POOL.shutdown()


def test_an_unowned_threads_walk_ends_where_its_referrers_end(heap_passes: list[int]) -> None:
    """The walk's own argument tuple (a referrer of the frontier it holds) is not climbed:
    an unowned thread's walk took every level to max_depth, one heap pass each."""
    from pytest_shutdown.ownership.owners import MAX_DEPTH

    loose = _Executor()
    try:
        thread = loose.spawn()
        assert find_owners({thread: thread}, {}) == {}
        assert len(heap_passes) < MAX_DEPTH // 2
    finally:
        loose.shutdown()


def test_a_global_tuple_of_just_the_target_still_owns_it(module: types.ModuleType) -> None:
    """The walk leaves out its own call's argument tuple (on 3.13 a new tuple of the frontier),
    never a tuple someone else holds with the same objects."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    module.HELD = (thread,)
    try:
        owner = find_owners({thread: thread}, {}, shortcut=False)[thread]
        assert (owner.kind, owner.name) == ("module-global", "ownership_subject.HELD")
    finally:
        stop.set()
        thread.join(10)


def test_the_callers_keys_are_not_climbed(heap_passes: list[int]) -> None:
    """A key ``(kind, thread)`` refers to its target, and the walk's closures hold the keys:
    climbing them took four more heap passes for every unowned thread."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert find_owners({("threads", thread): thread}, {}) == {}
        assert len(heap_passes) <= 2  # the thread, then the bound method it runs
    finally:
        stop.set()
        thread.join(10)


class _Service:
    def close(self) -> None:
        pass


def test_a_known_referrer_saves_a_heap_pass_and_the_owner_above_it_is_still_found(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """An object held through its bound method (``atexit.register(self.close)``'s shape) by a
    module global: found with one heap pass less when the method is given as known."""
    service = _Service()
    hook = service.close
    module.HOOK = hook
    walked = find_owners({service: service}, {})[service]
    passes_walking = len(heap_passes)
    forget_recent_owners()
    heap_passes.clear()
    known = find_owners({service: service}, {}, near={service: (hook,)})[service]
    assert (known.kind, known.name, known.path) == (walked.kind, walked.name, walked.path)
    assert (known.kind, known.name) == ("module-global", "ownership_subject.HOOK")
    assert len(heap_passes) == passes_walking - 1


def test_an_object_its_known_referrer_alone_holds_is_unowned_after_one_heap_pass(
    heap_passes: list[int],
) -> None:
    service = _Service()
    hook = service.close  # what atexit would hold (invisible to gc), here a local: no owner
    assert find_owners({service: service}, {}, near={service: (hook,)}) == {}
    assert len(heap_passes) == 1


def test_a_known_referrer_that_does_not_refer_to_the_target_is_ignored(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """A namespace given as a target's referrer owns nothing unless it holds the target."""
    module.OTHER = _Service()
    service = _Service()
    assert find_owners({service: service}, {}, near={service: (vars(module),)}) == {}


def test_a_fixture_reaching_a_remembered_globals_worker_owns_it(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """The narrowest owner first: a wider-scope fixture's value before a module global."""
    module.POOL = _Executor()
    try:
        first = module.POOL.spawn()
        find_owners({first: first}, {})
        second = module.POOL.spawn()
        value = {"engine": types.SimpleNamespace(worker=second)}
        roots = {id(value): ("key", "'engine'", value)}
        owner = find_owners({second: second}, roots)[second]
        assert (owner.kind, owner.key) == ("fixture", "key")
        assert find_owners({first: first}, roots)[first].kind == "module-global"
    finally:
        module.POOL.shutdown()


def test_the_resource_sharer_listener_is_a_stdlib_helper() -> None:
    import socket
    from multiprocessing import resource_sharer

    a, b = socket.socketpair()
    with a, b:
        dup = resource_sharer.DupFd(a.fileno())
        helpers = stdlib_helper_threads()
        assert [o.name for o in helpers.values()] == ["multiprocessing.resource_sharer"]
        os.close(dup.detach())


def test_creation_sites_put_user_frames_first(recording: None) -> None:
    pool = ThreadPoolExecutor(1)
    try:
        (worker,) = _workers(pool)  # the line that started the worker is inside _workers
        origin = origins.origin_of_thread(worker)
        assert origin is not None
        user = [frame for frame in origin.frames if frame[3]]
        library = [frame for frame in origin.frames if not frame[3]]
        assert user[0][2] == "_workers" and user[1][2].startswith("test_creation_sites")
        # Python 3.10 code objects have no co_qualname: the class comes from the frame's self.
        assert library[0][2] == "ThreadPoolExecutor._adjust_thread_count"
        assert origin.frames.index(user[0]) == 0
        assert "pool.submit(abs, -1).result()" in origins.render_origin(origin)
    finally:
        pool.shutdown()


@pytest.fixture
def not_recording() -> None:
    if origins._installs:  # noqa: SLF001
        pytest.skip("this session runs under the guard, which records creation sites already")


def test_uninstall_restores_the_start_methods(not_recording: None) -> None:
    import multiprocessing.process
    import subprocess

    before = (
        threading.Thread.start,
        multiprocessing.process.BaseProcess.start,
        subprocess.Popen.__init__,
    )
    origins.install()
    assert threading.Thread.start is not before[0]
    origins.uninstall()
    after = (
        threading.Thread.start,
        multiprocessing.process.BaseProcess.start,
        subprocess.Popen.__init__,
    )
    assert after == before


def test_nested_installs_keep_recording_until_the_last_uninstall(not_recording: None) -> None:
    original = threading.Thread.start
    origins.install()
    origins.install()  # e.g. an in-process pytester run under a guarded run
    origins.uninstall()
    assert threading.Thread.start is not original
    origins.uninstall()
    assert threading.Thread.start is original


def test_what_a_remembered_global_reaches_is_picked_without_a_heap_pass(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """A reusable executor's new pipe, test after test: found forwards from the global that
    owned its first worker; a pipe of the same kind that only a local holds is not."""
    from pytest_shutdown.ownership.owners import reached_by_recent_owners

    module.POOL = _Executor()
    reader, writer = os.pipe()
    mine, theirs = os.fdopen(reader, "rb"), os.fdopen(writer, "wb")
    try:
        first = module.POOL.spawn()
        find_owners({first: first}, {})  # the backward walk: the global is remembered
        module.POOL.pipe = mine  # type: ignore[attr-defined]
        heap_passes.clear()
        picked = reached_by_recent_owners(lambda obj: type(obj).__name__ == "BufferedReader")
        assert picked == [mine]
        assert reached_by_recent_owners(lambda obj: obj is theirs) == []
        assert heap_passes == []
    finally:
        mine.close()
        theirs.close()
        module.POOL.shutdown()


def test_a_global_found_during_the_walk_owns_what_it_reaches_below_without_more_passes(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """A pool's pipes lie a few levels below its workers: once the walk reached the global
    through the worker, the pipe is found forwards from it, not by more heap passes."""
    module.POOL = _Executor()
    pipe = types.SimpleNamespace()
    module.POOL.queue = types.SimpleNamespace(  # type: ignore[attr-defined]
        feeder=types.SimpleNamespace(writer=types.SimpleNamespace(pipe=pipe))
    )
    vars(module.POOL)  # the instance's dict made real now: naming a path does it otherwise
    try:
        worker = module.POOL.spawn()
        assert find_owners({worker: worker}, {})[worker].name == "ownership_subject.POOL"
        worker_passes = len(heap_passes)  # the walk to the global through the worker alone
        forget_recent_owners()
        heap_passes.clear()
        owners = find_owners({worker: worker, "pipe": pipe}, {})
        assert owners["pipe"].name == "ownership_subject.POOL"
        assert owners["pipe"].path == ".POOL.queue.feeder.writer.pipe"
        assert owners[worker].name == "ownership_subject.POOL"
        assert len(heap_passes) == worker_passes
    finally:
        module.POOL.shutdown()


def test_a_fixture_that_reaches_deep_still_owns_it_when_a_global_is_found_on_the_way(
    module: types.ModuleType, heap_passes: list[int]
) -> None:
    """The narrowest owner first: a wider-scope fixture's value holding the pipe owns it, even
    though the walk found a global (through the worker) that reaches it too."""
    module.POOL = _Executor()
    try:
        worker = module.POOL.spawn()
        pipe = types.SimpleNamespace()
        module.POOL.queue = types.SimpleNamespace(pipe=pipe)  # type: ignore[attr-defined]
        value = {"engine": types.SimpleNamespace(pipe=pipe)}
        roots = {id(value): ("key", "'engine'", value)}
        owners = find_owners({worker: worker, "pipe": pipe}, roots)
        assert (owners["pipe"].kind, owners["pipe"].key) == ("fixture", "key")
        assert owners[worker].kind == "module-global"
    finally:
        module.POOL.shutdown()


MONITORED_LIBRARY = """
import threading


def _idle(stop=threading.Event()):
    stop.wait()


class Bar:
    monitor = None  # the library's one monitor thread, started by the first bar

    def __init__(self, held_by_a_function=False):
        thread = threading.Thread(target=_idle, name="bar-monitor", daemon=True)
        if held_by_a_function:
            _idle.__defaults__[0].thread = thread  # reachable only through a function
        else:
            Bar.monitor = thread
        thread.start()


def stop():
    _idle.__defaults__[0].set()
"""


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Writes a fresh library module (its name) that starts a monitor thread; stops it after."""
    name = f"barlib_{os.getpid()}_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text(MONITORED_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    if name in sys.modules:
        sys.modules.pop(name).stop()


def test_a_library_loaded_after_the_last_search_is_searched_from_its_creation_site(
    recording: None, library: str, heap_passes: list[int]
) -> None:
    """The creation site's file is looked up among the modules loaded *now*: a library
    imported after an earlier search (which read the modules then) is still found, also when
    a module went meanwhile (as many modules loaded as at that search)."""
    loose = _Executor()
    sys.modules["ownership_throwaway"] = types.ModuleType("ownership_throwaway")
    try:
        early = loose.spawn()
        assert find_owners({early: early}, {}) == {}  # a search before the library's import
        del sys.modules["ownership_throwaway"]
        heap_passes.clear()
        bar = importlib.import_module(library).Bar()
        monitor = type(bar).monitor
        owner = find_owners({monitor: monitor}, {})[monitor]
        assert (owner.kind, owner.name) == ("class-attribute", f"{library}.Bar.monitor")
        assert heap_passes == []  # found forwards from the creation site
    finally:
        sys.modules.pop("ownership_throwaway", None)
        loose.shutdown()


def test_a_thread_a_librarys_function_holds_is_owned_by_the_backward_walk(
    recording: None, library: str, heap_passes: list[int]
) -> None:
    """The forward search from a creation site does not walk through functions (most of a
    module's objects); a thread held only through one (a default argument) is still owned,
    by the module global that holds the function, found by the backward walk."""
    module = importlib.import_module(library)
    module.Bar(held_by_a_function=True)
    monitor = module._idle.__defaults__[0].thread
    owner = find_owners({monitor: monitor}, {})[monitor]
    assert (owner.kind, owner.name) == ("module-global", f"{library}._idle")
    assert heap_passes  # the forward search did not reach it


def test_a_library_reloaded_under_its_name_from_another_file_is_searched_from_its_creation_site(
    recording: None,
    library: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    heap_passes: list[int],
) -> None:
    """A module removed and loaded again under the same name from another file (pytester's
    test modules, a library's copy in a fresh folder) leaves ``sys.modules`` as long as before
    and with the same last name: the new file is still found among the modules loaded now."""
    first = importlib.import_module(library)
    monitor = first.Bar().monitor
    assert find_owners({monitor: monitor}, {})[monitor].name == f"{library}.Bar.monitor"
    sys.modules.pop(library).stop()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / f"{library}.py").write_text(MONITORED_LIBRARY)
    monkeypatch.syspath_prepend(str(copy))
    second = importlib.import_module(library)
    assert second.__file__ != first.__file__
    heap_passes.clear()
    monitor = second.Bar().monitor
    owner = find_owners({monitor: monitor}, {})[monitor]
    assert (owner.kind, owner.name) == ("class-attribute", f"{library}.Bar.monitor")
    assert heap_passes == []  # found forwards from the new file's module


class _OneSlot:
    __slots__ = "worker"  # one slot given as a string, not a tuple

    def __init__(self, worker: object) -> None:
        self.worker = worker


def test_a_single_string_slot_is_one_attribute_on_every_path() -> None:
    """``__slots__ = "worker"`` declares one slot; iterated as it stands it read as the letters
    w, o, r, k, e, r and the owner path fell back to ``.<_OneSlot>``."""
    from pytest_shutdown.ownership import owners
    from pytest_shutdown.ownership.backrefs import _object_edges
    from pytest_shutdown.ownership.slots import slot_names

    worker = object()
    holder = _OneSlot(worker)
    assert slot_names(_OneSlot) == ("worker",)
    assert owners._edge(holder, worker) == ".worker"
    assert (".worker", worker) in list(_object_edges(holder))
