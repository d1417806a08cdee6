"""The guard's report: per-test records, the terminal section ``shutdown``, JSON, and xdist glue.

Records are plain data from the start; a test's travel on its teardown report (xdist serialises
it), so the controller logs them (:mod:`pytest_shutdown.plugin.records`) as each test ends, and a
crashed worker loses only the test it was running.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Generator, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import pytest_shutdown
from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._fast.node_markers import scanned_names_are_hooks
from pytest_shutdown._os.forks import this_pid
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.findings.markup import coloured
from pytest_shutdown.findings.text import DETAILS_HINT, cmdline_text, finding_lines, merged
from pytest_shutdown.plugin.hang import HANG_HANDLERS, HUNG_TEARDOWN_EXIT_CODE
from pytest_shutdown.plugin.interrupts import SigtermEndsSessionInOrder
from pytest_shutdown.plugin.records import (
    SCHEMA_VERSION,
    SLOW_GUARD_S,
    LogInUse,
    RecordLog,
    TargetRefused,
    assemble,
    collect,
    describe_os_error,
    durations_summary,
    in_progress_report,
    record_log_path,
    refusal_of_target,
    write_report,
)
from pytest_shutdown.plugin.settings import GuardSettings, create_folder, shows_details

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.budget import BudgetOutcome

__all__ = ["SCHEMA_VERSION", "ShutdownReport", "TestRecord", "durations_summary"]

#: The key under ``config.workeroutput`` that carries a worker's data to the controller.
WORKEROUTPUT_KEY = "pytest_shutdown"
#: The attribute of a teardown ``TestReport`` that carries the test's records (plain data).
REPORT_ATTR = "pytest_shutdown_records"
#: The key under ``workerinput`` naming the folder where a worker that ends at once leaves its
#: last records for the controller.
SPILL_KEY = "pytest_shutdown_spill"
#: The exit status of a process that a KeyboardInterrupt ends (128 + SIGINT).
_INTERRUPTED_EXIT = 130


def _claim(log: RecordLog) -> None:
    """Lock the record log for this run; a UsageError when another run holds it or it is refused."""
    try:
        log.claim()
    except LogInUse as exc:
        raise pytest.UsageError(
            f"--shutdown-report: the record log {exc}; give this run its own --shutdown-report "
            "path, or wait for that run to end"
        ) from None
    except TargetRefused as exc:
        raise pytest.UsageError(f"--shutdown-report: the record log {exc}") from None
    except OSError as exc:
        raise pytest.UsageError(
            f"--shutdown-report: the record log {str(log.path)!r} cannot be opened: "
            f"{describe_os_error(exc)}"
        ) from None


def plain_record(
    nodeid: str,
    worker: str | None,
    teardown_s: float,
    guard_s: float = 0.0,
    findings: list[dict[str, Any]] | None = None,
    budget: dict[str, Any] | None = None,
    reported: bool = True,
    guard_error: str | None = None,
    cut_short: str | None = None,
) -> dict[str, Any]:
    """A test's record as the log, the JSON report and xdist carry it."""
    plain = {
        "nodeid": nodeid,
        "worker": worker,
        "teardown_s": round(teardown_s, 6),
        "guard_s": round(guard_s, 6),
        "findings": findings if findings is not None else [],
        "budget": budget,
        "reported": reported,
    }
    if guard_error is not None:
        plain["guard_error"] = guard_error
    if cut_short is not None:
        plain["cut_short"] = cut_short
    return plain


@lazy_dataclass
class TestRecord:
    """What the guard saw for one test: findings (as dicts), teardown time, budget events.

    ``reported`` is False when the findings were not raised or warned: the test had already
    failed for the same reason (a pytest-timeout timeout, a teardown error).
    """

    nodeid: str
    worker: str | None
    teardown_s: float
    findings: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] | None = None
    reported: bool = True
    #: Seconds of ``teardown_s`` the guard itself spent (ownership search, grace wait).
    guard_s: float = 0.0
    #: The guard's own failure while checking this test (the test was not checked).
    guard_error: str | None = None
    #: What cut the test's teardown short (``SystemExit`` in a finalizer), else ``None``.
    cut_short: str | None = None

    def to_plain(self) -> dict[str, Any]:
        return plain_record(**vars(self))  # the fields are plain_record's parameters


def describe_guard_error(exc: BaseException) -> str:
    """The guard's own error as one line, even when the exception's ``str`` raises too."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a hostile exception
        text = "<message unreadable>"
    return f"{type(exc).__name__}: {text}"[:500]


def render_findings(findings: Iterable[Mapping[str, Any]], details: bool = False) -> str:
    """Render findings as text: the message and the facts that locate it (a survivor's command
    line and level, a hang's first user frame), then thread stacks and process command lines;
    with ``details`` (``-vv``, ``--shutdown-details``), every fact of the finding instead."""
    lines: list[str] = []
    # Identical findings are one line with a count; with details each keeps its own facts.
    shown = [(f, 1) for f in findings] if details else merged(findings)
    for finding, times in shown:
        lines.extend(finding_lines(finding, details=details, times=times))
        if details:
            continue  # every fact is listed, stacks and command lines included
        facts = finding.get("details", {})
        for thread in facts.get("threads", []):
            name = thread.get("name")
            if thread.get("native"):
                lines.append(f"  native thread {name!r} (tid {thread.get('tid')}):")
            else:
                daemon = "" if thread.get("daemon", True) else ", non-daemon"
                lines.append(f"  thread {name!r} (ident {thread.get('ident')}{daemon}):")
            stack = str(thread.get("stack") or "  <no stack>\n")
            lines.extend("    " + line for line in stack.rstrip("\n").splitlines())
            lines.extend(_started_at(thread))
        for proc in facts.get("processes", []):
            # A forked child repeats pytest's command line: name what started it instead.
            what = proc.get("what") or cmdline_text(proc.get("cmdline"))
            if proc.get("reparented") and proc.get("adopted", True):
                what += " [re-parented to pytest: its parent exited]"
            elif proc.get("reparented"):
                what += (
                    f" [its parent exited: re-parented to pid {proc.get('ppid')}, found by the "
                    "session marker]"
                )
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
            f"{cmdline_text(killed.get('cmdline'))}"
        )
    for thread in budget.get("threads", []):
        lines.append(f"  stack of thread {thread.get('name')!r} (ident {thread.get('ident')}):")
        lines.extend("    " + line for line in str(thread["stack"]).rstrip("\n").splitlines())
    return "\n".join(lines)


def budget_finding(name: str, budget: Mapping[str, Any]) -> Finding:
    """The ``shutdown-budget`` finding of a fired budget (``budget``: its plain outcome)."""
    return Finding(
        "shutdown-budget",
        f"the teardown of {name} ran past its {budget['budget_s']:g} s shutdown budget and was "
        f"interrupted after {budget['elapsed_s']:.2f} s ({budget['method']} method).",
        {k: budget[k] for k in ("budget_s", "elapsed_s", "method") if k in budget},
    )


class _Accepted:
    """The entries a report is made of: the running test's (sent with its teardown report),
    those accepted here (controller or single process, each logged as it comes), and their
    fold (:func:`collect`)."""

    def __init__(self, worker: str | None) -> None:
        self.worker = worker
        #: Entries accepted here, in record-log order. Clean tests' records are kept as rows
        #: (node id, teardown s, guard s, reported), each entry noting how many rows came before
        #: it, until a reader needs them all: most tests are clean, most runs read only times.
        self._entries: list[dict[str, Any]] = []
        self._rows_before: list[int] = []
        self._clean_rows: list[tuple[str, float, float, bool]] = []
        self._folded_at: tuple[int, dict[str, Any]] | None = None
        self._pending: list[dict[str, Any]] = []  # the running test's, sent with its report
        #: The record log (``--shutdown-report``, controller or single process only).
        self.log: RecordLog | None = None
        self._pid = os.getpid()

    def add(self, record: TestRecord) -> None:
        """Add one test's outcome (its teardown duration counts)."""
        self._pending.append({"type": "record", "record": record.to_plain(), "timed": True})

    def add_clean(self, nodeid: str, teardown_s: float, guard_s: float, reported: bool) -> None:
        """:meth:`add` for a clean test (the common case: no record object is made)."""
        if (
            self.worker is None
            and self.log is None
            and not self._pending
            and guard_s < SLOW_GUARD_S
            and this_pid() == self._pid
        ):  # nothing to send with the report, nothing to log, nothing to list: a row
            self._clean_rows.append((nodeid, teardown_s, guard_s, reported))
            return
        record = plain_record(nodeid, self.worker, teardown_s, guard_s, reported=reported)
        self._pending.append({"type": "record", "record": record, "timed": True})

    def add_pending(self, nodeid: str, findings: list[dict[str, Any]]) -> None:
        """Warn mode's candidates awaiting their grace: logged, so that a run killed before the
        verdict still names them, unconfirmed."""
        entry = {"type": "pending", "nodeid": nodeid, "worker": self.worker, "findings": findings}
        self._pending.append(entry)

    def add_decided(self, nodeid: str) -> None:
        """The verdict on a test's candidates came."""
        self._pending.append({"type": "decided", "nodeid": nodeid, "worker": self.worker})

    def add_long_lived(self, record: dict[str, Any]) -> None:
        """A thread or process owned by a module global or class attribute, alive at the end."""
        self._pending.append({"type": "long_lived", "item": {"worker": self.worker, **record}})

    def add_findings(self, nodeid: str, findings: list[dict[str, Any]]) -> None:
        """Add findings of a test made outside the guard (engine fixtures, ``shutdown_check``)."""
        if findings:
            record = plain_record(nodeid, self.worker, 0.0, findings=list(findings))
            self._pending.append({"type": "record", "record": record, "timed": False})

    def _accept(self, entry: dict[str, Any]) -> None:
        if this_pid() != self._pid:
            return  # a forked child that runs on: only the session's own process records
        self._entries.append(entry)
        self._rows_before.append(len(self._clean_rows))  # its place among the clean rows
        if self.log is not None:
            self.log.write(entry)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every entry accepted so far, clean tests' rows made into records, in order."""
        if self._clean_rows:
            self._entries[:] = _with_rows(self._entries, self._rows_before, self._clean_rows)
            self._clean_rows.clear()
            self._rows_before[:] = [0] * len(self._entries)
        return self._entries

    def _folded(self) -> dict[str, Any]:
        """``collect`` of the entries so far, cached until a new one comes."""
        rows = self._clean_rows
        count = len(self._entries) + len(rows)
        if self._folded_at is None or self._folded_at[0] != count:
            folded = collect(self._entries)  # the rows: only their times count (collect's rule)
            folded["durations"] = [*folded["durations"], *(round(row[1], 6) for row in rows)]
            folded["guard_times"] = [*folded["guard_times"], *(round(row[2], 6) for row in rows)]
            self._folded_at = (count, folded)
        return self._folded_at[1]

    @property
    def durations(self) -> list[float]:
        return list(self._folded()["durations"])

    @property
    def long_lived(self) -> list[dict[str, Any]]:
        """Long-lived resources accepted so far and those of this process not yet sent."""
        return [
            dict(entry.get("item") or {})
            for entry in (*self._entries, *self._pending)
            if entry.get("type") == "long_lived"
        ]

    def counts(self) -> dict[str, int]:
        return dict(Counter(f["code"] for r in self._folded()["records"] for f in r["findings"]))


@scanned_names_are_hooks
class ShutdownReport(_Accepted):
    """The report's pytest plugin object: hooks, the record log's life, the JSON report
    (``--shutdown-report``) and the terminal section ``shutdown``; an xdist worker's data goes
    into ``workeroutput``."""

    def __init__(self, config: pytest.Config, settings: GuardSettings) -> None:
        self.config = config
        self.settings = settings
        super().__init__(getattr(config, "workerinput", {}).get("workerid"))
        #: Why the JSON report could not be written (``None``: written, or not yet tried).
        self.report_error: str | None = None
        self._report_written = False
        #: Why an earlier run's report is still at the path (``None``: it is not).
        self._stale: str | None = None
        self._interrupted = False
        self._finished = False
        #: Warn mode: the non-daemon threads the exit waits for, described (:meth:`exit_blocked`).
        self._blocking: list[threading.Thread] = []
        self._blocked_by: list[dict[str, Any]] = []
        #: The report says the exit is blocked; the log stays open until it is not.
        self._awaiting_exit = False
        self._spill_dir: str | None = None  # controller: see SPILL_KEY
        if settings.report_path is not None and self.worker is None:
            create_folder(settings.report_path.parent, "--shutdown-report")
            self.log = RecordLog(record_log_path(settings.report_path))
            _claim(self.log)
        #: A SIGTERM the main thread cannot take: the report is written first. Its two hooks
        #: are this object's (one plugin object fewer to register).
        self.sigterm = SigtermEndsSessionInOrder(self.end_at_once)

    def _head(self) -> dict[str, Any]:
        """The record log's first line (and the report's head): the run's settings and pid."""
        settings = self.settings
        return {
            "schema_version": SCHEMA_VERSION,
            "pytest_shutdown_version": pytest_shutdown.__version__,
            "guard": settings.mode,
            "grace_s": settings.grace_s,
            "budget_s": settings.budget_s,
            "platform": settings.platform,
            "pid": os.getpid(),
        }

    def summary_lines(
        self, verbose: bool, collection_errors: int = 0, details: bool = False
    ) -> list[str]:
        """The terminal section ``shutdown`` (``details``: every fact of each finding)."""
        folded = self._folded()
        records = folded["records"]  # sorted by node id
        tests = len(folded["durations"])
        lines = [_summary_head(records, self.counts(), self.settings, tests, collection_errors)]
        lines += _record_lines(records, details)
        if self.long_lived:
            lines += _long_lived_lines(self.long_lived, self.settings.long_lived)
        lines += _lost_worker_lines(folded["lost_workers"])
        if verbose:
            lines += _duration_lines(folded["durations"], folded["guard_times"])
        return lines

    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionstart")
    def pytest_sessionstart_signals(self, session: pytest.Session) -> None:
        if self.settings.mode != "warn":  # warn mode observes only: no handler, no watch
            self.sigterm.start(session)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.log is not None:
            # before the log is emptied: never the old report alone
            self._stale = _mark_in_progress(self._head(), self.settings.report_path)
            self.log.open(self._head())
        HANG_HANDLERS.append(self._on_hung_teardown)

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._on_hung_teardown in HANG_HANDLERS:
            HANG_HANDLERS.remove(self._on_hung_teardown)
        if self._awaiting_exit and not any(t.is_alive() for t in self._blocking):
            atexit.unregister(self._exit_unblocked)
            self._exit_unblocked()  # they ended already: the exit waits for nothing of theirs
        if self.log is not None and not self._awaiting_exit:
            self.log.close()  # a run that never reached its end releases the path too
        if self._spill_dir is not None and os.getpid() == self._pid:
            shutil.rmtree(self._spill_dir, ignore_errors=True)

    @pytest.hookimpl(trylast=True, specname="pytest_unconfigure")
    def pytest_unconfigure_signals(self, config: pytest.Config) -> None:
        self.sigterm.stop()

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Ctrl-C or SIGTERM: the session is interrupted, its report is never complete."""
        if isinstance(excinfo.value, KeyboardInterrupt):
            self._interrupted = True

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: tell each worker where to leave its records if it ends at once."""
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="pytest-shutdown-spill-")
        node.workerinput[SPILL_KEY] = self._spill_dir

    def end_at_once(self, exitstatus: int) -> None:
        """The process ends now (a signal the main thread cannot take): the report is written."""
        self.write_before_exit([], exitstatus)

    def _on_hung_teardown(self, label: str, outcome: BudgetOutcome) -> None:
        """A teardown hung past its second budget: write the hung test's record, then exit."""
        budget = outcome.to_dict()
        finding = budget_finding(label.rpartition("::")[2], budget).to_dict()
        record = plain_record(
            label, self.worker, outcome.elapsed_s, findings=[finding], budget=budget
        )
        entry = {"type": "record", "record": record, "timed": True}
        self.write_before_exit([entry], HUNG_TEARDOWN_EXIT_CODE)

    def attach_pending(self, report: pytest.TestReport) -> None:
        """A test's teardown report carries its records (to the controller under xdist)."""
        if self._pending:
            setattr(report, REPORT_ATTR, self._pending)
            self._pending = []

    def accept_reported(self, report: pytest.TestReport) -> None:
        """Controller (or single process): accept a finished test's records, log them now."""
        if self.worker is not None:
            return
        for entry in getattr(report, REPORT_ATTR, None) or []:
            self._accept(entry)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """xdist controller: accept a finished worker's last records; note a crashed one."""
        worker = str(getattr(getattr(node, "gateway", None), "id", "?"))
        data = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_KEY)
        if data is not None:
            for entry in data.get("entries", []):
                self._accept(entry)
            self._accept({"type": "worker", "worker": worker, "lost": False})
        else:
            spilled = _take_spill(self._spill_dir, worker)
            for entry in spilled:
                self._accept(entry)
            error_text = str(error or "")[-500:]
            lost = {"type": "worker", "worker": worker, "lost": True, "error": error_text}
            if spilled:
                lost["spilled"] = len(spilled)
            self._accept(lost)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(
        self, session: pytest.Session, exitstatus: int
    ) -> Generator[None, None, None]:
        """A second Ctrl-C that breaks out of session end still ends the log, as interrupted."""
        try:
            return (yield)
        except KeyboardInterrupt:
            self._end_session(_INTERRUPTED_EXIT, interrupted=True)
            raise

    @pytest.hookimpl(trylast=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_in_order(self, session: pytest.Session, exitstatus: int) -> None:
        # A KeyboardInterrupt on its way out (pytest's finally): the process exits 130.
        propagating = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        self._end_session(
            _INTERRUPTED_EXIT if propagating else int(exitstatus),
            interrupted=propagating or self._interrupted,
        )

    def _end_session(self, exitstatus: int, *, interrupted: bool) -> None:
        pending, self._pending = self._pending, []
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKEROUTPUT_KEY] = {"worker": self.worker, "entries": pending}
            return
        for entry in pending:
            self._accept(entry)
        self.finish(exitstatus, interrupted=interrupted)

    def finish(self, exitstatus: int, *, aborted: bool = False, interrupted: bool = False) -> None:
        """End the record log and write the JSON report (once, in the session's process only).

        ``aborted`` (the process ends now) or ``interrupted`` (Ctrl-C, SIGTERM): the report says
        ``complete: false``; so does a log that could not be written (it is then assembled from
        the records in memory).
        """
        if self.log is None or self._finished or os.getpid() != self._pid:
            return  # (a log is made only with a report path)
        self._finished = True
        end: dict[str, Any] = {"type": "end", "exitstatus": exitstatus, "aborted": aborted}
        if interrupted:
            end["interrupted"] = True
        pairs = zip(self._blocking, self._blocked_by, strict=False)
        blocked = [] if aborted else [described for thread, described in pairs if thread.is_alive()]
        if blocked:
            end["exit_blocked_by"] = blocked
        self._accept(end)
        if self.log.error is not None:
            end["log_error"] = self.log.error
        if blocked:  # kept open (and locked) until the exit is no longer blocked
            self._awaiting_exit = True
            atexit.register(self._exit_unblocked)  # runs after the exit's join of the threads
        else:
            self.log.close()
        self._write_report()

    def exit_blocked(
        self, threads: list[threading.Thread], described: list[dict[str, Any]]
    ) -> None:
        """Warn mode, at session end: the exit will wait for these non-daemon threads. Until
        they end, the report says the process has not exited (``exit_blocked_by``)."""
        self._blocking = list(threads)
        self._blocked_by = list(described)

    def _exit_unblocked(self) -> None:
        """At exit (after the interpreter's join): the threads ended; the report says so."""
        if not self._awaiting_exit or self.log is None or os.getpid() != self._pid:
            return
        self._awaiting_exit = False
        self._blocking = []
        try:
            self._accept({"type": "exit_unblocked"})
            self._write_report()
        except Exception:  # noqa: BLE001, S110 - never an error at exit: the report stays as it was
            pass
        finally:
            self.log.close()

    def _write_report(self) -> None:
        if self.settings.report_path is None:
            return
        document = assemble([{"type": "session", **self._head()}, *self.entries])
        try:
            write_report(document, self.settings.report_path)
        except (OSError, TargetRefused) as exc:
            self.report_error = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
            if self._stale is not None:
                self.report_error += f"; {self._stale}"
        else:
            self._report_written = True

    def write_before_exit(self, entries: list[dict[str, Any]], exitstatus: int) -> None:
        """The process is about to end abruptly: log what is pending and write the report (an
        xdist worker spills them for the controller)."""
        capture = self.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            with contextlib.suppress(Exception):  # the process ends anyway
                capture.suspend_global_capture(in_=False)
        pending, self._pending = self._pending, []
        if self.worker is not None:
            folder = getattr(self.config, "workerinput", {}).get(SPILL_KEY)
            _spill(folder, self.worker, [*pending, *entries])
            return
        for entry in [*pending, *entries]:
            self._accept(entry)
        self.finish(exitstatus, aborted=True)

    def section_markup(self, exitstatus: int = 0) -> dict[str, bool]:
        """The title's colour, as pytest's summary: red for findings in a failed run, yellow for
        findings that did not fail it, green for none."""
        if not self.counts():
            return {"green": True}
        if int(exitstatus) != 0:
            return {"red": True, "bold": True}
        return {"yellow": True, "bold": True}

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return
        markup = self.section_markup(exitstatus)
        terminalreporter.section("shutdown", **markup)
        verbose = self.config.get_verbosity() > 0
        errors = terminalreporter.stats.get("error", [])
        collection_errors = sum(1 for r in errors if isinstance(r, pytest.CollectReport))
        details = shows_details(self.config)
        writer = terminalreporter._tw

        def paint(text: str) -> str:
            return str(writer.markup(text, **markup))

        codes = frozenset(self.counts())
        for line in self.summary_lines(verbose, collection_errors, details):
            terminalreporter.line(coloured(line, paint, codes))
        if codes and not details:
            terminalreporter.line(DETAILS_HINT)
        if self.settings.report_path is not None:
            self._say_what_became_of_the_report(terminalreporter, self.settings.report_path)

    def _say_what_became_of_the_report(self, terminalreporter: Any, path: Path) -> None:
        log = self.log
        problem = log.error if log is not None else None
        if log is not None and problem is not None:
            terminalreporter.line(
                f"shutdown report incomplete: writing the record log {log.path} stopped "
                f"after {log.lines} lines: {problem}; the tests went on",
                yellow=True,
            )
        if self.report_error is not None:
            terminalreporter.line(
                f"shutdown report not written to {path}: {self.report_error}", red=True
            )
        elif self._report_written:
            state = " (marked incomplete)" if problem is not None else ""
            if self._awaiting_exit:
                state += (
                    " (it says the process has not exited until the non-daemon threads the "
                    "exit waits for have ended)"
                )
            terminalreporter.line(f"shutdown report written to {path}{state}")


def _mark_in_progress(head: dict[str, Any], path: Path | None) -> str | None:
    """The report path says this run is in progress until the final report replaces it; if
    that cannot be written, the earlier run's report is removed. Returns why it is still there
    (``None``: it is not)."""
    if path is None:
        return None
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        write_report(in_progress_report(head, path, started), path)
    except (OSError, TargetRefused):
        if refusal_of_target(path) is not None:
            return None  # not a regular file (swapped in since the check): never removed
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        except OSError as exc:
            return f"an earlier run's report is still there ({describe_os_error(exc)})"
    return None


def _with_rows(
    entries: list[dict[str, Any]],
    rows_before: list[int],
    clean_rows: list[tuple[str, float, float, bool]],
) -> list[dict[str, Any]]:
    """``entries`` with the clean tests' rows made into records, each in its place:
    ``rows_before[i]`` rows came before ``entries[i]``."""
    rows = [
        {
            "type": "record",
            "record": plain_record(nodeid, None, teardown_s, guard_s, reported=reported),
            "timed": True,
        }
        for nodeid, teardown_s, guard_s, reported in clean_rows
    ]
    # An entry appended from outside (not through _accept) comes after every row so far.
    missing = len(entries) - len(rows_before)
    rows_before += [len(rows)] * missing
    merged: list[dict[str, Any]] = []
    taken = 0
    for entry, before in zip(entries, rows_before, strict=True):
        merged += rows[taken:before]
        taken = before
        merged.append(entry)
    return merged + rows[taken:]


def _take_spill(spill_dir: str | None, worker: str) -> list[dict[str, Any]]:
    """The records a worker that ended at once left in the spill folder (then removed)."""
    if spill_dir is None:
        return []
    path = Path(spill_dir) / f"{worker}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        path.unlink()
    except (OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def _spill(folder: str | None, worker: str | None, entries: list[dict[str, Any]]) -> None:
    """xdist worker ending at once: its last records go to the controller's spill folder."""
    if not folder or not entries:
        return
    with contextlib.suppress(OSError, TargetRefused):  # else the worker is listed as lost
        write_report({"entries": entries}, Path(folder) / f"{worker}.json")


def _summary_head(
    records: list[dict[str, Any]],
    counts: Mapping[str, int],
    settings: GuardSettings,
    tests: int,
    collection_errors: int,
) -> str:
    """The section's first line: what the guard found in how many tests, then its settings."""
    # Findings of no test (``<session end>``, ``<fixture NAME>``) are named, not counted.
    flagged = sum(1 for r in records if r["findings"] and not r["nodeid"].startswith("<"))
    beyond = sorted({r["nodeid"] for r in records if r["findings"] and r["nodeid"].startswith("<")})
    setting = f"guard in {settings.mode} mode, grace {settings.grace_s:g} s"
    if settings.budget_s:
        setting += f", budget {settings.budget_s:g} s"
    if counts:
        by_code = ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))
        head = f"{flagged} of {tests} test{'s' if tests != 1 else ''} with findings"
        if beyond:
            head += f", and findings at {', '.join(beyond)}"
        head += f" ({by_code})"
    elif tests:
        head = f"no findings in {tests} test{'s' if tests > 1 else ''}"
    else:
        head = "the guard checked nothing"
    if collection_errors:
        errors = f"{collection_errors} collection error{'s' if collection_errors > 1 else ''}"
        head += f"; not checked: {errors}" if tests else f": {errors}"
    elif not tests:
        head += ": no test ran"
    return f"{head} ({setting})"


def _record_lines(records: Iterable[Mapping[str, Any]], details: bool) -> list[str]:
    """Each kept test's findings (``details``: every fact), a failed guard or a slow one."""
    lines: list[str] = []
    for record in records:
        worker, findings = record.get("worker"), record["findings"]
        where = f"{record['nodeid']}" + (f" [{worker}]" if worker else "")
        shown = [(f, 1) for f in findings] if details else merged(findings)
        for finding, times in shown:
            first, *rest = finding_lines(finding, details=details, times=times)
            lines.append(f"{where}: {first}")
            lines.extend(rest)
        if record.get("guard_error") is not None:
            lines.append(f"{where}: not checked, the guard failed: {record['guard_error']}")
        elif not findings and record.get("guard_s", 0.0) >= SLOW_GUARD_S:
            lines.append(f"{where}: the guard waited {record['guard_s']:.2f} s")
    return lines


def _long_lived_label(item: Mapping[str, Any]) -> str:
    """How one long-lived resource is named: each kind says what identifies it."""
    kind, name = item["kind"], item.get("name")
    if kind == "thread":
        return f"thread {name!r}"
    if kind == "port":  # its pid is the holder's, not a port number
        return f"{name or 'socket'} (process {item.get('pid')})"
    if kind == "fd":
        return f"fd {item.get('fd')} ({name or '?'})"
    if item.get("pid") is None:
        return f"{kind} {name or '?'}"
    return f"{kind} {item.get('pid')} ({name or '?'})"


def _long_lived_lines(items: list[dict[str, Any]], treatment: str) -> list[str]:
    """The long-lived resources: a heading (``treatment``: the setting, e.g. ``"report"``),
    then each with its owner and the test that first started it."""
    lines = [
        f"long-lived resources ({len(items)}, owned by module globals or "
        f"class attributes; {treatment}ed):"
    ]
    for item in items:
        lines.append(
            f"  {_long_lived_label(item)} owned by {item['owner']['kind']} "
            f"{item['owner']['name']}, first started in {item['first_test']}"
        )
    return lines


def _lost_worker_lines(lost_workers: Iterable[Mapping[str, Any]]) -> list[str]:
    """The xdist workers that ended before their session: what of their records is kept."""
    return [
        f"worker {lost['worker']} ended at once: the records of the tests it finished are "
        "kept, and so is the record it left before exiting (the hung test's)"
        if lost.get("spilled")
        else f"worker {lost['worker']} crashed: the records of the tests it finished are "
        "kept, the test it was running is lost"
        for lost in lost_workers
    ]


def _duration_lines(durations: list[float], guard_times: list[float]) -> list[str]:
    """``-v``: the teardown durations and the guard's share of them (none without tests)."""
    d = durations_summary(durations)
    if not d["count"]:
        return []
    return [
        f"shutdown durations: median {d['median_s']:.4f} s, max {d['max_s']:.4f} s"
        f" over {d['count']} tests",
        f"shutdown guard time: {sum(guard_times):.2f} s in total"
        " (included in the durations: ownership searches and grace waits)",
    ]


#: The key under ``config.workeroutput`` that carries a worker's backref pictures.
GRAPHS_WORKEROUTPUT_KEY = "pytest_shutdown_graphs"


class RecordsTravelWithReports:
    """The report's per-test hooks when the guard is off (``--shutdown-report`` alone); with
    the guard on, its own report wrapper does this (one wrapper per phase, not two)."""

    def __init__(self, report: ShutdownReport) -> None:
        self.report = report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown":
            self.report.attach_pending(report)
        return report

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.report.accept_reported(report)


class GraphsRecorder:
    """``--shutdown-graphs=DIR``: the diagnosis draws into DIR, each picture prefixed and
    recorded with the running test's id; the section ``shutdown graphs`` names the files."""

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
        from pytest_shutdown.ownership.backrefs import GRAPHS, configure_graphs  # noqa: PLC0415

        self.previous = (GRAPHS.directory, GRAPHS.prefix)
        configure_graphs(self.directory)
        GRAPHS.listeners.append(self._record)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        from pytest_shutdown.ownership.backrefs import configure_graphs  # noqa: PLC0415

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
        from pytest_shutdown.ownership.backrefs import GRAPHS, configure_graphs  # noqa: PLC0415

        directory, prefix = self.previous or (None, "")
        configure_graphs(directory, prefix=prefix)
        if self._record in GRAPHS.listeners:
            GRAPHS.listeners.remove(self._record)
