"""The per-test record log (JSON Lines) and the report assembled from it.

``--shutdown-report=PATH`` first writes ``PATH``'s *record log*, a JSON Lines file beside it
(:func:`record_log_path`: ``report.json`` -> ``report.records.jsonl``). One line per event,
appended and flushed as it happens:

* ``{"type": "session", ...}``: the settings of the run (first line);
* ``{"type": "record", "record": {...}, "timed": bool}``: one test's record, written when the
  test ends (``timed``: the record carries the test's teardown duration);
* ``{"type": "long_lived", "item": {...}}``: a thread or process owned by a module global or a
  class attribute, still alive at session end (who owns it, which test first started it);
* ``{"type": "worker", "worker": "gw0", "lost": bool, "error": "..."}``: an xdist worker ended;
* ``{"type": "end", "exitstatus": int, "aborted": bool}``: the last line; ``aborted`` when the
  process ended at once (a teardown hung past its second budget), else the session ended in
  order.

So a run killed by SIGKILL, ``os._exit`` (pytest-timeout's ``thread`` method) or a double
Ctrl-C keeps every finished test's findings. At session end the JSON report is assembled from
the log; after a killed run the same assembly is one command::

    python -m pytest_shutdown.records report.records.jsonl -o report.json

The assembled document says ``"complete": false`` when the log has no ``end`` line or an
aborted one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: Version of the JSON layout written by ``--shutdown-report``; bumped on incompatible change.
SCHEMA_VERSION = 1
#: A test on which the guard spent this long (grace waited) is kept in the report.
SLOW_GUARD_S = 0.5


def record_log_path(report_path: Path) -> Path:
    """Where the record log of ``report_path`` lives: same folder, ``<stem>.records.jsonl``."""
    return report_path.with_name(report_path.stem + ".records.jsonl")


class RecordLog:
    """An append-only JSON Lines file; every line is flushed as soon as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def open(self, head: Mapping[str, Any]) -> None:
        """Start a new log (an old one of the same name is replaced) with its session line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - held for the run
        self.write({"type": "session", **head})

    def write(self, entry: Mapping[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(entry, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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


def collect(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Fold log entries into: ``head``, ``records`` (one per test and worker, merged, only
    those with findings, a budget event or a slow guard), ``durations``, ``guard_times``,
    ``long_lived``, ``workers``, ``lost_workers``, ``complete`` and ``exitstatus``."""
    head: dict[str, Any] = {}
    kept: dict[tuple[str, Any], dict[str, Any]] = {}
    durations: list[float] = []
    guard_times: list[float] = []
    long_lived: list[dict[str, Any]] = []
    workers: set[str] = set()
    lost: list[dict[str, Any]] = []
    end: Mapping[str, Any] | None = None
    for entry in entries:
        kind = entry.get("type")
        if kind == "session":
            head = {k: v for k, v in entry.items() if k != "type"}
        elif kind == "record":
            record = entry.get("record") or {}
            if entry.get("timed"):
                durations.append(float(record.get("teardown_s", 0.0)))
                guard_times.append(float(record.get("guard_s", 0.0)))
            if record.get("worker"):
                workers.add(str(record["worker"]))
            slow = float(record.get("guard_s", 0.0)) >= SLOW_GUARD_S
            if record.get("findings") or record.get("budget") or slow:
                key = (str(record.get("nodeid")), record.get("worker"))
                if key in kept:
                    _merge(kept[key], record)
                else:
                    kept[key] = {**record, "findings": list(record.get("findings") or [])}
        elif kind == "long_lived":
            long_lived.append(dict(entry.get("item") or {}))
        elif kind == "worker":
            workers.add(str(entry.get("worker")))
            if entry.get("lost"):
                lost.append({"worker": str(entry.get("worker")), "error": entry.get("error", "")})
        elif kind == "end":
            end = entry
    return {
        "head": head,
        "records": sorted(kept.values(), key=lambda r: str(r.get("nodeid"))),
        "durations": durations,
        "guard_times": guard_times,
        "long_lived": long_lived,
        "workers": sorted(workers),
        "lost_workers": lost,
        "complete": end is not None and not end.get("aborted"),
        "exitstatus": end.get("exitstatus") if end is not None else None,
    }


def durations_summary(durations: Iterable[float]) -> dict[str, Any]:
    """Count, median, max and total of the per-test shutdown (teardown) durations."""
    import statistics  # noqa: PLC0415 - not paid for at plugin load

    values = list(durations)
    if not values:
        return {"count": 0, "median_s": None, "max_s": None, "total_s": 0.0}
    return {
        "count": len(values),
        "median_s": round(statistics.median(values), 6),
        "max_s": round(max(values), 6),
        "total_s": round(sum(values), 6),
    }


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
        "exitstatus": data["exitstatus"],
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
    """Write the JSON document to ``path`` through a temporary file (never half a report)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_shutdown.records LOG [-o REPORT]``: assemble a report from a log."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_shutdown.records",
        description="Assemble the --shutdown-report JSON from its record log (e.g. after a "
        "killed run). Without -o the JSON goes to standard output.",
    )
    parser.add_argument("log", type=Path, help="the record log, e.g. report.records.jsonl")
    parser.add_argument("-o", "--output", type=Path, default=None, help="the JSON report to write")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        parser.error(f"log: {str(args.log)!r} is not a file")
    document = assemble(read_entries(args.log))
    if args.output is None:
        sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    else:
        write_report(document, args.output)
        state = "complete" if document["complete"] else "partial (the run did not end in order)"
        print(f"{args.output}: {document['summary']['tests']} tests, {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
