"""The guard's report: per-test records, the terminal section ``shutdown``, JSON, and xdist glue.

Records are plain data (dicts of str, numbers, lists) from the start, so the same records travel
through pytest-xdist's ``workeroutput``, are merged on the controller, and are rendered both as
terminal text and as JSON. A worker that crashes never sends its ``workeroutput``: its records
are lost and the worker is listed under ``lost_workers``; everything else is kept.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pytest_shutdown
from pytest_shutdown.settings import GuardSettings

#: Version of the JSON layout written by ``--shutdown-report``; bumped on incompatible change.
SCHEMA_VERSION = 1
#: The key under ``config.workeroutput`` that carries a worker's data to the controller.
WORKEROUTPUT_KEY = "pytest_shutdown"
#: A test on which the guard spent this long (grace waited) is kept in the report.
SLOW_GUARD_S = 0.5


@dataclass
class TestRecord:
    """What the guard saw for one test: findings (as dicts), teardown time, budget events.

    ``reported`` is False when the findings were recorded but not raised or warned, because the
    test had already failed for the same reason (a pytest-timeout timeout, a teardown error).
    """

    nodeid: str
    worker: str | None
    teardown_s: float
    findings: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] | None = None
    reported: bool = True
    #: Seconds of ``teardown_s`` the guard itself spent (ownership search, grace wait).
    guard_s: float = 0.0

    def to_plain(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "worker": self.worker,
            "teardown_s": round(self.teardown_s, 6),
            "guard_s": round(self.guard_s, 6),
            "findings": self.findings,
            "budget": self.budget,
            "reported": self.reported,
        }

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> TestRecord:
        return cls(
            nodeid=str(data["nodeid"]),
            worker=data.get("worker"),
            teardown_s=float(data.get("teardown_s", 0.0)),
            findings=list(data.get("findings", [])),
            budget=data.get("budget"),
            reported=bool(data.get("reported", True)),
            guard_s=float(data.get("guard_s", 0.0)),
        )


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


def _cmdline(parts: Iterable[str] | None) -> str:
    return " ".join(parts or []).replace("\n", "\\n") or "?"


def render_findings(findings: Iterable[Mapping[str, Any]]) -> str:
    """Render findings as text: the message, then thread stacks and process command lines."""
    lines: list[str] = []
    for finding in findings:
        lines.append(f"[{finding['code']}] {finding['message']}")
        details = finding.get("details", {})
        for thread in details.get("threads", []):
            lines.append(f"  thread {thread.get('name')!r} (ident {thread.get('ident')}):")
            stack = str(thread.get("stack") or "  <no stack>\n")
            lines.extend("    " + line for line in stack.rstrip("\n").splitlines())
            lines.extend(_started_at(thread))
        for proc in details.get("processes", []):
            # A forked child repeats pytest's command line: name what started it instead.
            what = proc.get("what") or _cmdline(proc.get("cmdline"))
            lines.append(f"  process {proc.get('pid')} ({proc.get('name')}): {what}")
            lines.extend(_started_at(proc))
    return "\n".join(lines)


def _started_at(record: Mapping[str, Any]) -> list[str]:
    if not record.get("started_at"):
        return []
    head = "    started at (user frames first)"
    if record.get("started_in"):
        head += f", during {record['started_in']}"
    return [head + ":"] + ["      " + line for line in str(record["started_at"]).splitlines()]


def render_budget(budget: Mapping[str, Any]) -> str:
    """Render a fired budget: the limit, the time, what was killed and every thread's stack."""
    lines = [
        f"shutdown budget of {budget['budget_s']:g} s exceeded after {budget['elapsed_s']:.2f} s"
        f" ({budget['method']} method)"
    ]
    for killed in budget.get("killed", []):
        lines.append(
            f"  killed process {killed.get('pid')} ({killed.get('name')}): "
            f"{_cmdline(killed.get('cmdline'))}"
        )
    for thread in budget.get("threads", []):
        lines.append(f"  stack of thread {thread.get('name')!r} (ident {thread.get('ident')}):")
        lines.extend("    " + line for line in str(thread["stack"]).rstrip("\n").splitlines())
    return "\n".join(lines)


class ShutdownReport:
    """Collects :class:`TestRecord` data and renders it; a pytest plugin object.

    On an xdist worker the data goes into ``workeroutput`` at session end; on the controller (or
    without xdist) it is merged, written as JSON (``--shutdown-report``) and summarised in the
    terminal section ``shutdown``.
    """

    def __init__(self, config: pytest.Config, settings: GuardSettings) -> None:
        self.config = config
        self.settings = settings
        self.worker: str | None = getattr(config, "workerinput", {}).get("workerid")
        self.records: list[TestRecord] = []
        self.durations: list[float] = []
        self.workers: set[str] = set()
        self.lost_workers: list[dict[str, Any]] = []
        self.guard_times: list[float] = []
        #: Threads and processes owned by module globals / class attributes, alive at the end.
        self.long_lived: list[dict[str, Any]] = []

    # --- collecting ---

    def add(self, record: TestRecord) -> None:
        """Add one test's outcome; only tests with findings or a budget event are kept whole."""
        self.durations.append(record.teardown_s)
        self.guard_times.append(record.guard_s)
        # A slow guard is kept too, so that the report says which tests it cost time.
        if record.findings or record.budget or record.guard_s >= SLOW_GUARD_S:
            self._keep(record)

    def add_long_lived(self, record: dict[str, Any]) -> None:
        """A thread or process owned by a module global or class attribute, alive at the end."""
        self.long_lived.append({"worker": self.worker, **record})

    def add_findings(self, nodeid: str, findings: list[dict[str, Any]]) -> None:
        """Add findings of a test made outside the guard (engine fixtures, ``shutdown_check``)."""
        if findings:
            self._keep(
                TestRecord(
                    nodeid=nodeid, worker=self.worker, teardown_s=0.0, findings=list(findings)
                )
            )

    def _keep(self, record: TestRecord) -> None:
        for kept in self.records:
            if kept.nodeid == record.nodeid and kept.worker == record.worker:
                kept.findings.extend(record.findings)
                kept.teardown_s = max(kept.teardown_s, record.teardown_s)
                kept.budget = kept.budget or record.budget
                kept.reported = kept.reported and record.reported
                return
        self.records.append(record)

    def to_plain(self) -> dict[str, Any]:
        """This process's data as plain types (what a worker sends)."""
        return {
            "worker": self.worker,
            "records": [r.to_plain() for r in self.records],
            "durations": [round(d, 6) for d in self.durations],
            "guard_times": [round(d, 6) for d in self.guard_times],
            "long_lived": self.long_lived,
        }

    def merge(self, data: Mapping[str, Any]) -> None:
        """Merge the plain data of one worker."""
        if data.get("worker"):
            self.workers.add(str(data["worker"]))
        self.records.extend(TestRecord.from_plain(r) for r in data.get("records", []))
        self.durations.extend(float(d) for d in data.get("durations", []))
        self.guard_times.extend(float(d) for d in data.get("guard_times", []))
        self.long_lived.extend(data.get("long_lived", []))

    # --- rendering ---

    def counts(self) -> dict[str, int]:
        return dict(Counter(f["code"] for r in self.records for f in r.findings))

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``--shutdown-report``."""
        records = sorted(self.records, key=lambda r: r.nodeid)
        return {
            "schema_version": SCHEMA_VERSION,
            "pytest_shutdown_version": pytest_shutdown.__version__,
            "guard": self.settings.mode,
            "grace_s": self.settings.grace_s,
            "budget_s": self.settings.budget_s,
            "platform": self.settings.platform,
            "workers": sorted(self.workers),
            "lost_workers": self.lost_workers,
            "summary": {
                "tests": len(self.durations),
                "tests_with_findings": sum(1 for r in records if r.findings),
                "findings": self.counts(),
                "budgets_exceeded": sum(1 for r in records if r.budget),
            },
            "durations": durations_summary(self.durations),
            "guard_s": round(sum(self.guard_times), 6),
            "long_lived": self.long_lived,
            "tests": [r.to_plain() for r in records],
        }

    def summary_lines(self, verbose: bool) -> list[str]:
        """The lines of the terminal section ``shutdown``."""
        records = sorted(self.records, key=lambda r: r.nodeid)
        counts = self.counts()
        flagged = sum(1 for r in records if r.findings)
        head = f"guard {self.settings.mode}, grace {self.settings.grace_s:g} s"
        if self.settings.budget_s:
            head += f", budget {self.settings.budget_s:g} s"
        if counts:
            by_code = ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))
            head += f": {flagged} of {len(self.durations)} tests with findings ({by_code})"
        else:
            head += f": no findings in {len(self.durations)} tests"
        lines = [head]
        for record in records:
            where = f"{record.nodeid}" + (f" [{record.worker}]" if record.worker else "")
            if record.budget:
                lines.append(f"{where}: [budget] teardown exceeded {record.budget['budget_s']:g} s")
            for finding in record.findings:
                lines.append(f"{where}: [{finding['code']}] {finding['message']}")
            if not record.findings and record.guard_s >= SLOW_GUARD_S:
                lines.append(f"{where}: the guard waited {record.guard_s:.2f} s")
        if self.long_lived:
            lines.append(
                f"long-lived resources ({len(self.long_lived)}, owned by module globals or "
                f"class attributes; {self.settings.long_lived}ed):"
            )
            for item in self.long_lived:
                label = (
                    repr(item.get("name"))
                    if item["kind"] == "thread"
                    else f"{item.get('pid')} ({item.get('name') or '?'})"
                )
                lines.append(
                    f"  {item['kind']} {label} owned by {item['owner']['kind']} "
                    f"{item['owner']['name']}, first started in {item['first_test']}"
                )
        for lost in self.lost_workers:
            lines.append(f"worker {lost['worker']} crashed: its shutdown records are lost")
        if verbose:
            d = durations_summary(self.durations)
            if d["count"]:
                lines.append(
                    f"shutdown durations: median {d['median_s']:.4f} s, max {d['max_s']:.4f} s"
                    f" over {d['count']} tests"
                )
                lines.append(
                    f"shutdown guard time: {sum(self.guard_times):.2f} s in total"
                    " (included in the durations: ownership searches and grace waits)"
                )
        return lines

    # --- hooks ---

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """xdist controller: merge a finished worker's data; note a crashed one."""
        data = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_KEY)
        if data is not None:
            self.merge(data)
        else:
            worker = getattr(getattr(node, "gateway", None), "id", "?")
            self.lost_workers.append({"worker": str(worker), "error": str(error or "")[-500:]})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKEROUTPUT_KEY] = self.to_plain()
            return
        path = self.settings.report_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput"):
            return
        terminalreporter.section("shutdown")
        verbose = self.config.get_verbosity() > 0
        for line in self.summary_lines(verbose):
            terminalreporter.line(line)
        if self.settings.report_path is not None:
            terminalreporter.line(f"shutdown report written to {self.settings.report_path}")


#: The key under ``config.workeroutput`` that carries a worker's backref pictures.
GRAPHS_WORKEROUTPUT_KEY = "pytest_shutdown_graphs"


class GraphsRecorder:
    """``--shutdown-graphs=DIR``: the diagnosis draws into DIR; the summary names the files.

    While a test runs, :data:`pytest_shutdown.checks.backrefs.GRAPHS` points at DIR with the
    test's id as file-name prefix; every picture drawn is recorded with that id. Workers send
    theirs through ``workeroutput``; the controller prints the section ``shutdown graphs``.
    """

    def __init__(self, config: pytest.Config, directory: Path) -> None:
        self.config = config
        self.directory = directory
        self.current: str | None = None
        self.graphs: list[dict[str, Any]] = []
        self.previous: tuple[Any, str] | None = None

    def _record(self, graph: Any) -> None:
        self.graphs.append({"nodeid": self.current, **graph.to_details()})

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from pytest_shutdown.checks.backrefs import GRAPHS, configure_graphs  # noqa: PLC0415

        self.previous = (GRAPHS.directory, GRAPHS.prefix)
        configure_graphs(self.directory)
        GRAPHS.listeners.append(self._record)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        from pytest_shutdown.checks.backrefs import configure_graphs  # noqa: PLC0415

        self.current = nodeid
        configure_graphs(self.directory, prefix=nodeid.replace("::", "-").replace("/", "-"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.graphs.extend(getattr(node, "workeroutput", {}).get(GRAPHS_WORKEROUTPUT_KEY, []))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[GRAPHS_WORKEROUTPUT_KEY] = list(self.graphs)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput"):
            return
        terminalreporter.section("shutdown graphs")
        if not self.graphs:
            terminalreporter.line(f"no backref pictures drawn (folder {self.directory})")
        for graph in sorted(self.graphs, key=lambda g: str(g["nodeid"])):
            where = graph["nodeid"] or "(outside a test)"
            terminalreporter.line(f"{where}: {graph['png'] or graph['dot']}")
            if graph.get("note"):
                terminalreporter.line(f"  note: {graph['note']}")

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from pytest_shutdown.checks.backrefs import GRAPHS, configure_graphs  # noqa: PLC0415

        directory, prefix = self.previous or (None, "")
        configure_graphs(directory, prefix=prefix)
        if self._record in GRAPHS.listeners:
            GRAPHS.listeners.remove(self._record)
