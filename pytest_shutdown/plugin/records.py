"""The per-test record log (JSON Lines) and the report assembled from it.

``--shutdown-report=PATH`` appends one line per event to ``PATH``'s record log (``session``,
``record``, ``long_lived``, ``worker``, ``pending``/``decided``, ``end``, ``exit_unblocked``:
docs/reports.md describes each), flushed as it happens, so a killed run keeps every finished
test's findings. The JSON report is assembled from the log at session end, or after a killed run
by ``python -m pytest_shutdown.plugin.records report.records.jsonl -o report.json``; it says
``"complete": false`` (and why) when the run did not end in order. While a run is in progress,
``PATH`` says so (:func:`in_progress_report`), never describing an earlier run. Only regular
files are written (:func:`refusal_of_target`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Version of the JSON layout written by ``--shutdown-report``; bumped on incompatible change.
SCHEMA_VERSION = 1
#: A test on which the guard spent this long (grace waited) is kept in the report.
SLOW_GUARD_S = 0.5


#: How a record log's name ends; no report path may (a report would replace another run's log).
RECORD_LOG_SUFFIX = ".records.jsonl"


def record_log_path(report_path: Path) -> Path:
    """Where the record log of ``report_path`` lives: same folder, ``<stem>.records.jsonl``."""
    return report_path.with_name(report_path.stem + RECORD_LOG_SUFFIX)


def is_record_log_name(path: Path) -> bool:
    """``path`` is named as a record log is (in any letter case: some file systems ignore it)."""
    return path.name.lower().endswith(RECORD_LOG_SUFFIX)


def in_progress_report(
    head: Mapping[str, Any], report_path: Path, started_at: str
) -> dict[str, Any]:
    """What the report path holds while a run is in progress: an empty report that says
    ``"complete": false`` and why, naming the run and its record log (``in_progress``)."""
    log = record_log_path(report_path)
    document = assemble([{"type": "session", **head}])
    document["incomplete"] = (
        f"the run has not finished, or it was killed or could not write its report (pid "
        f"{head.get('pid')}, started {started_at}); the tests it finished are in its record "
        f"log: python -m pytest_shutdown.plugin.records {log} -o {report_path}"
    )
    document["in_progress"] = {
        "pid": head.get("pid"),
        "started_at": started_at,
        "record_log": str(log),
    }
    return document


#: Where no report or record log may go: kernel interfaces, not storage.
PSEUDO_FILESYSTEMS = ("/proc", "/sys")


class TargetRefused(Exception):
    """A report or record-log path the plugin must not write (the message says why)."""


class LogInUse(Exception):
    """Another live run holds the record log (``pid``: its process, when its head says so)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
        super().__init__(f"{str(path)!r} is in use by another live run ({who})")


def _kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def refusal_of_target(path: Path) -> str | None:
    """Why ``path`` must not be written (``None``: it may be): an existing target that is not a
    regular file (never replaced or followed), or a path under ``/proc`` or ``/sys``."""
    absolute = Path(os.path.abspath(path))
    existing = next((p for p in (absolute, *absolute.parents) if os.path.lexists(p)), None)
    if existing is not None:
        real = os.path.realpath(existing)
        for root in PSEUDO_FILESYSTEMS:
            if real == root or real.startswith(root + os.sep):
                return f"it is under {root}, a kernel interface, not a place for files"
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there (a file in the way is the folder check's to name)
    except OSError as exc:
        return f"it cannot be inspected ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return f"it exists and is {_kind_of(mode)}; only a regular file is ever replaced"


def describe_os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the reason and its errno name."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


class RecordLog:
    """An append-only JSON Lines file; every line is written through at once.

    Only the process that opened it writes. A failed write (a full disk) stops the writing for
    good, kept in :attr:`error`; the run goes on. While open, an exclusive ``flock`` tells a
    second run on the same path that this one is alive (:meth:`claim`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()
        #: Why writing stopped (``None`` while every line was written).
        self.error: str | None = None
        self.lines = 0

    @property
    def owned_here(self) -> bool:
        """This is the process that opened the log (not a forked child)."""
        return os.getpid() == self._pid

    def claim(self) -> None:
        """Open the log without truncating it and lock it: :class:`TargetRefused`,
        :class:`LogInUse` otherwise."""
        refusal = refusal_of_target(self.path)
        if refusal is not None:
            raise TargetRefused(f"{str(self.path)!r}: {refusal}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        flags |= getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in since the check never blocks
        fd = os.open(self.path, flags, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TargetRefused(f"{str(self.path)!r}: it is not a regular file")
            try:
                import fcntl  # noqa: PLC0415 - POSIX only

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # pragma: no cover - not POSIX: no lock
                pass
            except OSError:
                raise LogInUse(self.path, _pid_in_head(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        self._pid = os.getpid()
        self._fd = fd

    def open(self, head: Mapping[str, Any]) -> None:
        """Start the log (a previous run's lines dropped) with its session line."""
        if self._fd is None:
            self.claim()
        if self._fd is None or not self.owned_here:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError as exc:
            self.error = describe_os_error(exc)
            return
        self.write({"type": "session", **head})

    def write(self, entry: Mapping[str, Any]) -> None:
        """Append one line; dropped in another process, after a failed write, or when closed."""
        if self._fd is None or self.error is not None or not self.owned_here:
            return
        data = (json.dumps(entry, default=str) + "\n").encode("utf-8")
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError as exc:
            self.error = describe_os_error(exc)
            return
        self.lines += 1

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self.owned_here:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _pid_in_head(path: Path) -> int | None:
    """The ``pid`` of a record log's session line, if it has one yet."""
    try:
        with open(path, encoding="utf-8") as lines:
            head = json.loads(lines.readline() or "{}")
        pid = head.get("pid") if isinstance(head, dict) else None
        return int(pid) if isinstance(pid, int) else None
    except (OSError, ValueError):
        return None


def read_entries(path: Path) -> Iterator[dict[str, Any]]:
    """The entries of a record log; a line cut short by a killed writer is skipped."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a process killed while writing it
            if isinstance(entry, dict):
                yield entry


def _merge(kept: dict[str, Any], record: Mapping[str, Any]) -> None:
    kept["findings"] = list(kept.get("findings") or []) + list(record.get("findings") or [])
    kept["teardown_s"] = max(kept.get("teardown_s", 0.0), record.get("teardown_s", 0.0))
    kept["budget"] = kept.get("budget") or record.get("budget")
    kept["reported"] = bool(kept.get("reported", True)) and bool(record.get("reported", True))
    for key, value in record.items():
        kept.setdefault(key, value)


class _Folded:
    """What :func:`collect` gathers while it reads the log, one method per kind of line."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.kept: dict[tuple[str, Any], dict[str, Any]] = {}
        self.durations: list[float] = []
        self.guard_times: list[float] = []
        self.long_lived: list[dict[str, Any]] = []
        self.workers: set[str] = set()
        self.lost: list[dict[str, Any]] = []
        self.end: Mapping[str, Any] | None = None
        self.unchecked = 0
        self.cut_short: list[str] = []
        self.unblocked = False
        #: (node id, worker) -> the findings of candidates still waiting for their verdict
        self.waiting: dict[tuple[str, Any], list[dict[str, Any]]] = {}

    def add(self, entry: Mapping[str, Any]) -> None:
        kind = entry.get("type")
        if kind == "session":
            self.head = {k: v for k, v in entry.items() if k != "type"}
        elif kind == "record":
            self._record(entry.get("record") or {}, bool(entry.get("timed")))
        elif kind == "long_lived":
            self.long_lived.append(dict(entry.get("item") or {}))
        elif kind == "worker":
            self._worker(entry)
        elif kind == "end":
            self.end = entry
        elif kind == "exit_unblocked":
            self.unblocked = True
        elif kind in ("pending", "decided"):
            self._pending(entry)

    def _pending(self, entry: Mapping[str, Any]) -> None:
        """Candidates waiting for their verdict, kept (unconfirmed) until their ``decided``."""
        key = (str(entry.get("nodeid")), entry.get("worker"))
        if entry.get("type") == "decided":
            self.waiting.pop(key, None)
            return
        self.waiting.setdefault(key, []).extend(
            {
                **finding,
                "message": f"{finding.get('message', '')} [not confirmed: the run ended before"
                " its grace ran out]",
                "details": {**(finding.get("details") or {}), "unconfirmed": True},
            }
            for finding in entry.get("findings") or []
        )

    def _record(self, record: Mapping[str, Any], timed: bool) -> None:
        """One test's record: its durations counted, kept (merged per test and worker) if
        :func:`_worth_keeping`."""
        if timed:
            self.durations.append(float(record.get("teardown_s", 0.0)))
            self.guard_times.append(float(record.get("guard_s", 0.0)))
        if record.get("worker"):
            self.workers.add(str(record["worker"]))
        if record.get("guard_error"):
            self.unchecked += 1
        if record.get("cut_short"):
            self.cut_short.append(str(record.get("nodeid")))
        if not _worth_keeping(record):
            return
        key = (str(record.get("nodeid")), record.get("worker"))
        if key in self.kept:
            _merge(self.kept[key], record)
        else:
            self.kept[key] = {**record, "findings": list(record.get("findings") or [])}

    def _worker(self, entry: Mapping[str, Any]) -> None:
        """An xdist worker's end: lost ones make the report incomplete."""
        self.workers.add(str(entry.get("worker")))
        if entry.get("lost"):
            worker = {"worker": str(entry.get("worker")), "error": entry.get("error", "")}
            if entry.get("spilled"):
                worker["spilled"] = int(entry["spilled"])
            self.lost.append(worker)

    def result(self) -> dict[str, Any]:
        for (nodeid, worker), findings in self.waiting.items():  # the run ended first
            self._record({"nodeid": nodeid, "worker": worker, "findings": findings}, False)
        self.waiting = {}
        end = self.end
        blocked = [] if end is None or self.unblocked else list(end.get("exit_blocked_by") or [])
        why = _incomplete(end, self.lost, self.unchecked, self.cut_short, blocked)
        return {
            "head": self.head,
            "records": sorted(self.kept.values(), key=lambda r: str(r.get("nodeid"))),
            "durations": self.durations,
            "guard_times": self.guard_times,
            "long_lived": self.long_lived,
            "workers": sorted(self.workers),
            "lost_workers": self.lost,
            "complete": end is not None and why is None,
            "incomplete": why,
            "interrupted": bool(end is not None and end.get("interrupted")),
            "exitstatus": end.get("exitstatus") if end is not None else None,
            "exit_blocked_by": blocked,
        }


def _worth_keeping(record: Mapping[str, Any]) -> bool:
    """A record the report lists: findings, a budget event, a slow guard, a guard that failed
    or a teardown cut short. The others only count in the durations."""
    return bool(
        record.get("findings")
        or record.get("budget")
        or float(record.get("guard_s", 0.0)) >= SLOW_GUARD_S
        or record.get("guard_error")
        or record.get("cut_short")
    )


def collect(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Fold log entries into ``head``, ``records`` (those worth keeping, merged per test and
    worker), ``durations``, ``complete`` and the rest :meth:`_Folded.result` lists."""
    folded = _Folded()
    for entry in entries:
        folded.add(entry)
    return folded.result()


def _incomplete(
    end: Mapping[str, Any] | None,
    lost: Sequence[Mapping[str, Any]],
    unchecked: int = 0,
    cut_short: Sequence[str] = (),
    blocked: Sequence[Mapping[str, Any]] = (),
) -> str | None:
    """Why the report is not complete (``None`` when it is)."""
    if end is None:
        return "the run did not end in order (the record log has no end line)"
    if end.get("aborted"):
        return f"the process ended at once (exit status {end.get('exitstatus')})"
    if blocked:
        count = len(blocked)
        names = ", ".join(
            f"{t.get('name')!r} (started in {t.get('started_in') or '?'})" for t in blocked
        )
        return (
            f"the process has not exited: the session ended (exit status "
            f"{end.get('exitstatus')}), but the interpreter's exit waits for {count} non-daemon "
            f"thread{'s' if count != 1 else ''} the tests left: {names}"
        )
    if end.get("interrupted"):
        return f"the session was interrupted (exit status {end.get('exitstatus')})"
    if end.get("log_error"):
        return f"the record log could not be written: {end['log_error']}"
    if lost:
        workers = ", ".join(str(w.get("worker")) for w in lost)
        return f"worker {workers} ended before its session did"
    if unchecked:
        return f"the guard failed on {unchecked} test{'s' if unchecked > 1 else ''} (not checked)"
    if cut_short:
        count = len(cut_short)
        return (
            f"the teardown of {count} test{'s' if count != 1 else ''} was cut short by "
            f"SystemExit (the finalizers still due did not run): {', '.join(cut_short)}"
        )
    return None


def durations_summary(durations: Iterable[float]) -> dict[str, Any]:
    """Count, median, max and total of the per-test shutdown (teardown) durations."""
    values = list(durations)
    if not values:
        return {"count": 0, "median_s": None, "max_s": None, "total_s": 0.0}
    return {
        "count": len(values),
        "median_s": round(_median(values), 6),
        "max_s": round(max(values), 6),
        "total_s": round(sum(values), 6),
    }


def _median(values: list[float]) -> float:
    """``statistics.median``, whose import (``fractions``, a regex compiled) costs some 4 ms."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def assemble(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON document of ``--shutdown-report``, built from record-log entries."""
    data = collect(entries)
    head, records = data["head"], data["records"]
    counts = Counter(f["code"] for r in records for f in r.get("findings", []))
    return {
        "schema_version": SCHEMA_VERSION,
        "pytest_shutdown_version": head.get("pytest_shutdown_version"),
        "guard": head.get("guard"),
        "grace_s": head.get("grace_s"),
        "budget_s": head.get("budget_s"),
        "platform": head.get("platform"),
        "complete": data["complete"],
        "incomplete": data["incomplete"],
        "interrupted": data["interrupted"],
        "exitstatus": data["exitstatus"],
        "exit_blocked_by": data["exit_blocked_by"],
        "workers": data["workers"],
        "lost_workers": data["lost_workers"],
        "summary": {
            "tests": len(data["durations"]),
            "tests_with_findings": sum(1 for r in records if r.get("findings")),
            "findings": dict(counts),
            "budgets_exceeded": sum(1 for r in records if r.get("budget")),
        },
        "durations": durations_summary(data["durations"]),
        "guard_s": round(sum(data["guard_times"]), 6),
        "long_lived": data["long_lived"],
        "tests": records,
    }


def write_report(document: Mapping[str, Any], path: Path) -> None:
    """Write the JSON document to ``path`` through a temporary file (never half a report); a
    refused target (:func:`refusal_of_target`) raises :class:`TargetRefused`."""
    refusal = refusal_of_target(path)
    if refusal is not None:
        raise TargetRefused(f"{str(path)!r}: {refusal}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(document, indent=2, default=str) + "\n")
        refusal = refusal_of_target(path)  # swapped for a special file meanwhile?
        if refusal is not None:
            raise TargetRefused(f"{str(path)!r}: {refusal}")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


#: The bytes of the report's name that its temporary file's name keeps (the name limit is 255).
_TEMP_NAME_KEEP = 200


def _temp_prefix(name: str) -> str:
    """The report's name, cut so that the random part and ``.tmp`` still fit in NAME_MAX."""
    raw = os.fsencode(name)
    if len(raw) > _TEMP_NAME_KEEP:
        name = os.fsdecode(raw[:_TEMP_NAME_KEEP])
    return name + "."


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_shutdown.plugin.records LOG [-o REPORT]``: assemble a report from a
    log."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_shutdown.plugin.records",
        description="Assemble the --shutdown-report JSON from its record log (e.g. after a "
        "killed run). Without -o the JSON goes to standard output.",
    )
    parser.add_argument("log", type=Path, help="the record log, e.g. report.records.jsonl")
    parser.add_argument("-o", "--output", type=Path, default=None, help="the JSON report to write")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        parser.error(f"log: {str(args.log)!r} is not a file")
    if args.output is not None:
        if is_record_log_name(args.output):
            parser.error(
                f"-o: {str(args.output)!r} is named as a record log is (*{RECORD_LOG_SUFFIX}); "
                "give the report another name"
            )
        refusal = refusal_of_target(args.output)
        if refusal is not None:
            parser.error(f"-o: {str(args.output)!r} is refused: {refusal}")
    document = assemble(read_entries(args.log))
    if args.output is None:
        sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    else:
        try:
            write_report(document, args.output)
        except TargetRefused as exc:
            parser.error(f"-o: refused: {exc}")
        except OSError as exc:
            parser.error(f"-o: {str(args.output)!r} cannot be written: {describe_os_error(exc)}")
        state = "complete" if document["complete"] else f"partial ({document['incomplete']})"
        print(f"{args.output}: {document['summary']['tests']} tests, {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
