"""The primitives of leak accounting that the resource kinds, the guard and ``no_leaks`` share
(:mod:`pytest_shutdown.helpers.leaks` re-exports them).

* :func:`take_snapshot` records what exists now (threads, descendant processes, freeze count);
* :func:`started_since` names what was started after a snapshot and is still running;
* :func:`await_exit` gives those a grace period, polling against one deadline;
* :func:`leak_findings` turns what is left into
  :class:`~pytest_shutdown.findings.finding.Finding` data;
* :func:`kill_process_trees` restores order afterwards.

Cheap when nothing leaked: a snapshot is ``threading.enumerate()``, ``gc.get_freeze_count()`` and
one ``waitid(WNOHANG | WNOWAIT)`` (has this process any child?). The descendants are walked only
when a child exists and a pid was allocated since the last walk (``ns_last_pid``); stacks and
command lines are read only for what is reported.
"""

from __future__ import annotations

import fnmatch
import functools
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import field
from typing import Any

from pytest_shutdown._fast import marks
from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._fast.moments import reading
from pytest_shutdown._os import escaped
from pytest_shutdown._os.children import walk_descendants
from pytest_shutdown._os.forks import this_pid
from pytest_shutdown._os.proc_stat import process_running as process_running
from pytest_shutdown._os.proc_stat import read_stat, stat_fields
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources.base import after_grace
from pytest_shutdown.resources.labels import callable_name, process_label, thread_label

#: A predicate that returns True for a thread that must not be reported.
ThreadFilter = Callable[[threading.Thread], bool]
#: One entry of ``allow=``: a glob pattern matched against the thread name, or a predicate.
AllowRule = str | ThreadFilter

#: The name prefix of pytest-shutdown's own threads (watchdogs): never reported.
OWN_THREAD_PREFIX = "pytest-shutdown"

#: Frames kept per thread stack in a finding (the innermost ones).
STACK_LIMIT = 40

#: How long to wait for leaked-looking threads and processes before paying for one gc.collect():
#: an executor dropped without shutdown() ends its workers only when it is collected.
_COLLECT_AFTER_S = 0.05

#: psutil.STATUS_ZOMBIE and psutil.STATUS_DEAD (psutil is imported only when a child exists).


@lazy_dataclass(frozen=True)
class LeakSnapshot:
    """What existed when the snapshot was taken: the live ``threading.Thread`` objects (identity:
    idents are reused), the live descendant pids, ``gc.get_freeze_count()``."""

    threads: frozenset[threading.Thread]
    pids: frozenset[int]
    freeze_count: int
    taken_at: float = field(default_factory=time.monotonic, compare=False)


@lazy_dataclass(frozen=True)
class Started:
    """Threads and processes started after a snapshot that are still running."""

    threads: tuple[threading.Thread, ...] = ()
    pids: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.threads or self.pids)

    def without(
        self, threads: Iterable[threading.Thread] = (), pids: Iterable[int] = ()
    ) -> Started:
        """A copy without the given threads and pids (e.g. those owned by a fixture)."""
        skip_threads = set(threads)
        skip_pids = set(pids)
        return Started(
            tuple(t for t in self.threads if t not in skip_threads),
            tuple(p for p in self.pids if p not in skip_pids),
        )


def child_state() -> int | None:
    """One ``waitid(WNOHANG | WNOWAIT)``, once per moment: None when this process has no child,
    0 when none has ended, else the pid of an ended child not reaped yet (a zombie)."""
    return reading("child_state", _read_child_state)


def _read_child_state() -> int | None:
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # pragma: no cover - not Unix
        return 0
    try:
        info = waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    except OSError:  # pragma: no cover - e.g. EINTR; be safe and look
        return 0
    return info.si_pid if info is not None else 0


def _may_have_children() -> bool:
    """False only when this process certainly has no child process."""
    return child_state() is not None


#: ``os.kill`` as imported, whichever wrapper is put on it later (signal 0 only asks).
_probe = os.kill
#: (pid, ns_last_pid at the last scan, the descendants it found, the threads started then)
_scan_cache: tuple[int, bytes, frozenset[int], int] | None = None


def last_pid() -> bytes | None:
    """The last pid (or tid) the kernel allocated in this pid namespace, once per moment; None
    where it cannot be read."""
    return reading("ns_last_pid", _last_pid)


def _last_pid() -> bytes | None:
    return escaped.last_allocated_pid()


def own_tasks() -> list[str]:
    """The tids of this process's tasks (``/proc/self/task``), listed once per moment."""
    return reading("own_tasks", _list_own_tasks)


def _list_own_tasks() -> list[str]:
    try:
        return os.listdir("/proc/self/task")
    except OSError:
        return []


def _walk_descendants(pid: int) -> frozenset[int] | None:
    """Every descendant of ``pid`` (:func:`~pytest_shutdown._os.children.walk_descendants`; this
    process's thread ids are this moment's); None where the kernel does not list children."""
    own = own_tasks if pid == this_pid() else None
    walked = walk_descendants(pid, own)
    return None if walked is None else frozenset(walked)


def descendant_pids() -> frozenset[int]:
    """The pids of this process's descendants (recursive), once per moment.

    No child: one ``waitid``. No pid allocated since the last scan, or each one went to a thread
    this process started or to another process's family (:func:`nothing_of_ours_since`): the
    last scan's answer. Otherwise a walk down the children lists (elsewhere than Linux, psutil).
    """
    return reading("descendant_pids", _read_descendants)


def _read_descendants() -> frozenset[int]:
    """The tree walk's answer, with the session's processes that left the tree (by the marker:
    :mod:`pytest_shutdown._os.escaped`)."""
    tree = _read_descendant_pids()
    if escaped.watching():
        return tree | escaped.escaped_processes(tree, last_pid())
    return tree


def cached_descendants(marker: bytes) -> frozenset[int] | None:
    """This process's descendants as the last scan at ``ns_last_pid`` == ``marker`` found them,
    less those reaped since; None when no scan was made at ``marker``."""
    global _scan_cache
    cached = _scan_cache
    if cached is None or cached[1] != marker or cached[0] != this_pid():
        return None
    there = _less_reaped(cached[2])
    if there is not cached[2]:
        _scan_cache = (cached[0], cached[1], there, cached[3])
    return there


def _less_reaped(pids: frozenset[int]) -> frozenset[int]:
    """``pids`` less those that no longer exist: a process reaped since the scan (a test's
    ``Popen.wait()``) frees no pid number and allocates none, so ``ns_last_pid`` does not move.
    One ``kill(pid, 0)`` each (a zombie still exists); the same set when none is gone."""
    gone = []
    for pid in pids:
        try:
            _probe(pid, 0)
        except ProcessLookupError:
            gone.append(pid)
        except OSError:  # EPERM: it exists
            pass
    return pids.difference(gone) if gone else pids


#: Pids allocated elsewhere that a check looks up one by one (whose child is it?) before a fresh
#: walk of the descendants is the cheaper answer.
FOREIGN_LOOKUPS = 8
#: What :func:`_parent_of` answers for a task it could not read (``-1`` is no pid).
_UNREADABLE = -1


def nothing_of_ours_since(
    then: bytes, started: int, now: bytes, descendants: AbstractSet[int] | None = None
) -> bool:
    """Whether no task created between the ``ns_last_pid`` readings ``then`` and ``now`` is this
    process's or its descendants'. The kernel allocates pids upwards, so each task created in
    between has a number in ``(then, now]``; each must be a thread this process started
    (``started``: :func:`~pytest_shutdown.ownership.origins.threads_started` read before
    ``then``), or, with ``descendants`` (at ``then``) given and at most
    :data:`FOREIGN_LOOKUPS` of them, a task that is gone or whose parent is neither this process,
    nor one of ``descendants``, nor this process's parent (what a thread of ours names).

    An orphan a descendant left names its new parent: this process where it is a subreaper,
    else a process no walk down from here would have reached either.

    The guard asks twice for the same pids (reading its marks, then comparing them): the last
    answer is kept for the same question (a task found not ours stays not ours)."""
    global _last_answer
    question = (this_pid(), then, started, now, descendants)
    answer = _last_answer
    if answer is not None and answer[0] == question:
        return answer[1]
    verdict = _nothing_of_ours_since(then, started, now, descendants)
    _last_answer = (question, verdict)
    return verdict


#: ``(question, answer)`` of the last :func:`nothing_of_ours_since`.
_last_answer: tuple[tuple[Any, ...], bool] | None = None


def _nothing_of_ours_since(
    then: bytes, started: int, now: bytes, descendants: AbstractSet[int] | None
) -> bool:
    try:
        start, end = int(then), int(now)
    except ValueError:
        return False
    tids = origins.tids_started_since(started)
    if tids is None:
        return False
    lookups = FOREIGN_LOOKUPS if descendants is not None else 0
    if not 0 < end - start <= len(tids) + lookups:
        return False  # more allocated than that, or the pids wrapped around
    own = set(tids)
    others = [pid for pid in range(start + 1, end + 1) if pid not in own]
    if not others:
        return True
    if len(others) > lookups or descendants is None:
        return False
    ours = {this_pid(), os.getppid(), _UNREADABLE}
    for pid in others:
        parent = _parent_of(pid)  # None: gone, whatever it was
        if parent is not None and (
            parent in ours
            or parent in descendants
            or (escaped.may_parent_escaped(parent) and escaped.carries_marker(pid))
        ):
            return False
    return True


def _parent_of(pid: int) -> int | None:
    """The parent of task ``pid`` (a thread's: its process's); None when it is gone,
    :data:`_UNREADABLE` when it cannot be read."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return _UNREADABLE
    if fields is None:
        return None
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return _UNREADABLE


def descendants_if_nothing_of_ours(marker: bytes, started: int) -> frozenset[int] | None:
    """The last scan's descendants, kept as the answer at ``marker`` when no task created since
    that scan is ours (:func:`nothing_of_ours_since`; ``started`` read before ``marker``);
    None when a walk is needed."""
    global _scan_cache
    cached = _scan_cache
    pid = this_pid()
    if cached is None or cached[0] != pid:
        return None
    # No descendant at the last scan: no pid is looked up (one waitid answers for them all).
    if not nothing_of_ours_since(cached[1], cached[3], marker, cached[2] or None):
        return None
    kept = _less_reaped(cached[2])
    _scan_cache = (pid, marker, kept, started)
    return kept


def _read_descendant_pids() -> frozenset[int]:
    global _scan_cache
    pid = this_pid()
    started = origins.threads_started()  # before the marker: a thread started now is not ours
    marker = last_pid()  # read before scanning: a process created during the scan moves it
    kept = descendants_if_nothing_of_ours(marker, started) if marker is not None else None
    if kept is not None:
        return kept
    cached = _scan_cache
    unmoved = marker is not None and cached is not None and cached[:2] == (pid, marker)
    if unmoved and cached is not None and not cached[2]:
        return cached[2]  # no child then, and no pid allocated anywhere since: none now
    if not _may_have_children():
        _scan_cache = (pid, marker, frozenset(), started) if marker is not None else None
        return frozenset()
    if unmoved and cached is not None:
        there = _less_reaped(cached[2])
        if there is not cached[2]:
            _scan_cache = (pid, cached[1], there, cached[3])
        return there
    walked = _walk_descendants(pid)
    if walked is None:  # no /proc/PID/task/TID/children here: psutil scans the process table
        import psutil  # noqa: PLC0415 - only paid for when a child process exists

        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:  # pragma: no cover - /proc unreadable
            return frozenset()
        walked = frozenset(child.pid for child in children)
    _scan_cache = (pid, marker, walked, started) if marker is not None else None
    return walked


def take_snapshot(*, threads: bool = True, processes: bool = True) -> LeakSnapshot:
    """Record the live threads, descendant processes and the gc freeze count."""
    return LeakSnapshot(
        threads=frozenset(threading.enumerate()) if threads else frozenset(),
        pids=descendant_pids() if processes else frozenset(),
        freeze_count=gc.get_freeze_count(),
    )


def thread_filter(allow: Iterable[AllowRule] = ()) -> ThreadFilter:
    """Compile ``allow=`` into one predicate: True for a thread that must not be reported.

    A string is a case-sensitive glob matched against the thread's name (``"pydevd.*"``); a
    callable receives the ``threading.Thread`` and returns True to ignore it. pytest-shutdown's
    own threads (``pytest-shutdown*``) are always ignored.
    """
    patterns: list[str] = []
    predicates: list[ThreadFilter] = []
    for rule in allow:
        if isinstance(rule, str):
            patterns.append(rule)
        elif callable(rule):
            predicates.append(rule)
        else:
            raise TypeError(
                f"allow: {rule!r} is neither a thread-name glob pattern (str) nor a predicate "
                "taking a threading.Thread"
            )

    def allowed(thread: threading.Thread) -> bool:
        name = thread_name(thread)
        if name.startswith(OWN_THREAD_PREFIX):
            return True
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return True
        return any(predicate(thread) for predicate in predicates)

    return allowed


def _thread_running(thread: threading.Thread) -> bool:
    # Foreign threads seen through threading (_DummyThread) can be neither joined nor tracked.
    return (
        thread.is_alive()
        and thread is not threading.current_thread()
        and not isinstance(thread, threading._DummyThread)
    )


def started_since(
    before: LeakSnapshot,
    *,
    threads: bool = True,
    processes: bool = True,
    allow: ThreadFilter | None = None,
) -> Started:
    """The threads and processes started after ``before`` and still running now (no waiting)."""
    new_threads: tuple[threading.Thread, ...] = ()
    if threads:
        new_threads = tuple(
            t
            for t in threading.enumerate()
            if t not in before.threads and _thread_running(t) and not (allow and allow(t))
        )
    new_pids: tuple[int, ...] = ()
    if processes:
        now = descendant_pids()
        if now:
            fresh = now - before.pids
            fresh -= multiprocessing_helper_pids(fresh)
            new_pids = tuple(sorted(p for p in fresh if process_running(p)))
    return Started(new_threads, new_pids)


#: The last part of the name of a module that keeps a process-lifetime helper in a global, in
#: multiprocessing and every fork of it (``multiprocess``, loky, billiard: its semaphore tracker
#: is the resource tracker of Python 3.7).
HELPER_MODULE_NAMES = ("resource_tracker", "forkserver", "resource_sharer", "semaphore_tracker")

#: last parts -> (len(sys.modules) when listed, the names of the modules so named then)
_modules_named_seen: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {}


def modules_named(*last: str) -> tuple[str, ...]:
    """The names of the loaded modules whose last part is one of ``last``, whatever package
    they are in (listed again only after an import)."""
    seen = _modules_named_seen.get(last)
    count = len(sys.modules)
    if seen is not None and seen[0] == count:
        return seen[1]
    names = tuple(name for name in list(sys.modules) if name.rpartition(".")[2] in last)
    _modules_named_seen[last] = (count, names)
    return names


def helper_module_names() -> tuple[str, ...]:
    """The loaded modules named like :data:`HELPER_MODULE_NAMES`, whatever package."""
    return modules_named(*HELPER_MODULE_NAMES)


def process_lifetime_helpers() -> list[object]:
    """The process-lifetime helper objects of multiprocessing and its forks: a global of a
    :data:`HELPER_MODULE_NAMES` module that is an instance of a class that module defines."""
    found: list[object] = []
    for name in helper_module_names():
        namespace = getattr(sys.modules.get(name), "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            if getattr(type(value), "__module__", None) == name and not isinstance(value, type):
                found.append(value)
    return found


def helper_numbers(helper: object, suffix: str) -> set[int]:
    """The non-negative ints ``helper`` keeps in attributes named ``*<suffix>`` (``_pid``,
    ``_forkserver_pid``; ``_fd``, ``_forkserver_alive_fd``)."""
    try:
        attrs = vars(helper)
    except TypeError:
        return set()
    return {
        value
        for attr, value in list(attrs.items())
        if attr.endswith(suffix) and type(value) is int and value >= 0
    }


def multiprocessing_helper_pids(among: Iterable[int] = ()) -> frozenset[int]:
    """Pids of this process's fork servers and resource trackers (see
    :func:`process_lifetime_helpers`): started on first use, kept until exit, never a test's
    leak (what a fork server starts stays checked). A helper that keeps no pid (billiard's
    semaphore tracker and fork server) is found among ``among`` by how it was started."""
    pids: set[int] = set()
    for helper in process_lifetime_helpers():
        pids.update(p for p in helper_numbers(helper, "pid") if p > 0)
    starts = tuple(f"from {name} import main" for name in helper_module_names())
    if starts:
        pids.update(p for p in among if p not in pids and _started_as_helper(p, starts))
    return frozenset(pids)


def _started_as_helper(pid: int, starts: tuple[str, ...]) -> bool:
    """Whether ``pid`` is our child started as ``python -c "from <helper module> import main;
    main(...)"`` (the children of a fork server repeat its command line: not ours)."""
    process = read_stat(pid)
    if process is None or process.ppid != this_pid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    code = argv[argv.index(b"-c") + 1] if b"-c" in argv[:-1] else b""
    return code.decode(errors="replace").startswith(starts)


def await_exit(started: Started, grace: float, *, collect: bool = True) -> Started:
    """Wait up to ``grace`` seconds (one deadline) for ``started`` to end; return what is left.

    Threads are joined, processes polled without reaping them (their owners need the status).
    When something still runs after a short wait, one ``gc.collect()`` runs (dropped executors
    stop their workers only when collected); ``collect=False`` skips it.
    """
    deadline = time.monotonic() + max(grace, 0.0)
    collect_at = time.monotonic() + _COLLECT_AFTER_S
    left = started
    delay = 0.002
    while True:
        threads = tuple(t for t in left.threads if _thread_running(t))
        pids = tuple(p for p in left.pids if process_running(p))
        left = Started(threads, pids)
        now = time.monotonic()
        if not left or now >= deadline:
            return left
        if collect and now >= collect_at:
            collect = False
            gc.collect()
            continue
        step = min(delay, deadline - now)
        if threads:
            threads[0].join(step)
        else:
            time.sleep(step)
        delay = min(delay * 2, 0.05)


def thread_name(thread: threading.Thread) -> str:
    """``thread.name``, or what ``threading`` stored for a subclass whose ``name`` raises."""
    try:
        return str(thread.name)
    except Exception:  # noqa: BLE001 - any error of the user's property
        stored = vars(thread).get("_name")
        if isinstance(stored, str):
            return stored
        return f"<{type(thread).__name__}, name unreadable>"


def _thread_daemon(thread: threading.Thread) -> bool | None:
    try:
        return bool(thread.daemon)
    except Exception:  # noqa: BLE001 - a subclass's property
        return None


def _thread_record(thread: threading.Thread, frames: dict[int, Any]) -> dict[str, Any]:
    frame = frames.get(thread.ident) if thread.ident is not None else None
    stack = "".join(traceback.format_stack(frame)[-STACK_LIMIT:]) if frame is not None else ""
    origin = origins.origin_of_thread(thread)
    target = getattr(thread, "_target", None)
    return {
        "name": thread_name(thread),
        "ident": thread.ident,
        "daemon": _thread_daemon(thread),
        "stack": stack,
        "target": callable_name(target)
        if target is not None or type(thread) is threading.Thread
        else callable_name(type(thread)),
        **(origin.to_dict() if origin is not None else {}),
    }


def _process_record(pid: int) -> dict[str, Any]:
    import psutil  # noqa: PLC0415

    record: dict[str, Any] = {"pid": pid, "name": None, "cmdline": [], "ppid": None}
    origin = origins.origin_of_process(pid)
    if origin is not None:  # what started it: the Process name and target, the creating code
        record.update(origin.to_dict())
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            record["name"] = proc.name()
            record["ppid"] = proc.ppid()
            record["cmdline"] = proc.cmdline()
    except psutil.Error:
        pass
    if origin is None:
        _describe_by_ancestor(record)
    return record


@functools.lru_cache(maxsize=1)
def _own_command_line() -> list[str]:
    import psutil  # noqa: PLC0415

    try:
        return list(psutil.Process().cmdline())
    except psutil.Error:
        return []


def _describe_by_ancestor(record: dict[str, Any]) -> None:
    """A process no ``Popen``/``Process`` here started (a daemon, a grandchild): its command
    line, and the start call of the recorded process it most likely descends from."""
    from pytest_shutdown.ownership.containment import first_ancestor  # noqa: PLC0415

    argv = record["cmdline"]
    forked = argv == _own_command_line()  # a fork without exec repeats ours: says nothing
    command = " ".join(" ".join([os.path.basename(argv[0]), *argv[1:]]).split()) if argv else ""
    if command and not forked:
        record["what"] = command if len(command) <= 60 else command[:57] + "..."
    ancestor = first_ancestor(record["pid"])
    origin = origins.origin_of_process(ancestor[0]) if ancestor is not None else None
    site = origins.start_site(origin) if origin is not None else None
    if ancestor is not None and site is not None:
        record["site"] = f"{site} (through its ancestor {ancestor[0]}, {ancestor[1]})"


def leak_findings(
    left: Started,
    *,
    grace: float,
    subject: str = "the block",
    freeze_before: int | None = None,
    freeze_after: int | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Finding]:
    """What is left as ``thread-leak``, ``process-leak`` and ``gc-frozen-leak`` findings;
    ``subject`` names where (``"fixture 'engine'"``), ``extra`` joins every finding's details."""
    findings: list[Finding] = []
    extra = dict(extra or {})
    if left.threads:
        frames = sys._current_frames()
        records = [_thread_record(t, frames) for t in left.threads]
        names = ", ".join(thread_label(r) for r in records)
        count = len(records)
        message = (
            f"{count} thread{'s' if count != 1 else ''} started in {subject} still "
            f"running {after_grace(grace)}: {names}."
        )
        findings.append(
            Finding("thread-leak", message, {"threads": records, "grace_s": grace, **extra})
        )
    if left.pids:
        records = [_process_record(pid) for pid in left.pids]
        described = ", ".join(process_label(r) for r in records)
        count = len(records)
        message = (
            f"{count} child process{'es' if count != 1 else ''} started in {subject} still "
            f"running {after_grace(grace)}: {described}."
        )
        details = {"processes": records, "grace_s": grace, **extra}
        findings.append(Finding("process-leak", message, details))
    # Only growth is a leak: frozen objects that die leave the permanent generation, so the count
    # drifts down by itself while something else holds a freeze.
    if freeze_before is not None and freeze_after is not None and freeze_after > freeze_before:
        findings.append(
            Finding(
                "gc-frozen-leak",
                f"gc.get_freeze_count() went from {freeze_before} to {freeze_after} in "
                f"{subject}: a gc.freeze() was left behind.",
                {"before": freeze_before, "after": freeze_after, **extra},
            )
        )
    return findings


def kill_process_trees(
    pids: Iterable[int], *, timeout: float = 5.0, why: str = "kill_process_trees"
) -> list[dict[str, Any]]:
    """SIGKILL each process and its descendants; wait (one deadline) until they have ended.

    Nothing is reaped (the owners collect the exit status). The one tree killer
    (:func:`pytest_shutdown._os.killer.kill_trees`) records each kill with ``why``: a death
    asked for is never collateral. Returns one record per process killed.
    """
    from pytest_shutdown._os.killer import kill_trees  # noqa: PLC0415

    return kill_trees(pids, why=why, timeout=timeout, describe=_process_record)


#: The guard's one-pass reading reads the descendants through these (it imports nothing above it).
marks.DESCENDANTS = marks.DescendantReadings(
    origins.threads_started,
    cached_descendants,
    descendant_pids,
    descendants_if_nothing_of_ours,
    nothing_of_ours_since,
)
