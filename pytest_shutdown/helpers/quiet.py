"""``no_logged_errors``: a graceful shutdown logs no error and prints no traceback.

vLLM #48745: during a graceful ``AsyncLLM.shutdown()`` the output-handler task logs
``logger.exception("AsyncLLM output_handler failed.")`` with an ``EngineDeadError`` traceback,
though the shutdown succeeds. Nothing fails, so no test notices; users read the traceback as a
crash. :class:`ErrorWatch` collects, around a block, what such a shutdown leaves:

* log records at ``ERROR`` or above of any logger, ``propagate=False`` ones included. It wraps
  ``logging.Logger.callHandlers`` (every record a logger handles passes there once, after the
  logger's level and filters), calls the original unchanged and restores it after: what every
  handler (the user's, pytest's caplog) receives is unchanged;
* ``Traceback (most recent call last):`` blocks and ``ERROR``/``CRITICAL`` log lines written to
  ``sys.stderr`` (a tee forwards every write unchanged);
* the same in the stderr of child processes: files (a path, or a file the child writes to) are
  read from where they ended when the block began; pipes are read at the end until EOF or a
  deadline.

One ``shutdown-logged-error`` finding per distinct error (identical ones merged, with a count)
naming the logger, the message, the exception type and where it was logged (file:line).
"""

from __future__ import annotations

import logging
import os
import re
import select
import stat
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

from pytest_shutdown._base.hidden import contextmanager  # no contextlib frame on failure
from pytest_shutdown.findings.finding import Finding, ShutdownContractError

__all__ = ["ErrorWatch", "Logged", "no_logged_errors", "scan_text"]

TRACEBACK_HEAD = "Traceback (most recent call last):"
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
#: vLLM's child-process prefix: ``(EngineCore_DP0 pid=123) ``.
_PREFIX = re.compile(r"^\([\w.\-]+ pid=\d+\)\s")
#: A log line at ERROR or above: ``ERROR:root:msg`` (basicConfig), ``ERROR 12-05 10:00:00
#: [file.py:12] msg`` (vLLM), ``2026-12-05 10:00:00,123 ERROR name: msg``, ``2026-12-05
#: 10:00:00 | ERROR | name | msg``, ``[ERROR] msg``.
_LOG_LINE = re.compile(
    r"^(?:\d[\d\-/:.,T ]*\s*\|?\s+)?\[?(?P<level>ERROR|CRITICAL)\]?(?:[\s:|]+|$)(?P<rest>.*)$"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::|$)")
#: The most of a stream read at the end of a block, and of a traceback kept in a finding.
_MAX_READ = 4 * 1024 * 1024
_MAX_TRACEBACK = 4000
_MAX_MESSAGE = 300


@dataclass(slots=True, eq=False)
class Logged:
    """One error seen during the block: a log record, or a traceback or log line in a stream."""

    source: str
    _: KW_ONLY
    logger: str = ""
    level: str = "ERROR"
    message: str = ""
    exception: str = ""
    exception_line: str = ""
    where: str = ""
    function: str = ""
    thread: str = ""
    traceback: str = ""

    def key(self) -> tuple[str, ...]:
        return (self.source, self.logger, self.level, self.message, self.exception_line, self.where)

    def details(self, count: int) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__} | {"count": count}

    @classmethod
    def of_record(cls, record: logging.LogRecord) -> Logged:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format is still an error logged
            message = str(record.msg)
        exception = exception_line = text = ""
        if record.exc_info and record.exc_info[0] is not None:
            kind, value, tb = record.exc_info
            exception = kind.__qualname__
            exception_line = "".join(traceback.format_exception_only(kind, value)).strip()
            text = "".join(traceback.format_exception(kind, value, tb))
        return cls(
            "log",
            logger=record.name,
            level=record.levelname,
            message=message,
            exception=exception,
            exception_line=exception_line.splitlines()[-1] if exception_line else "",
            where=f"{record.pathname}:{record.lineno}",
            function=record.funcName or "",
            thread=record.threadName or "",
            traceback=text[-_MAX_TRACEBACK:],
        )


def _strip(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _traceback_block(lines: list[str], start: int) -> tuple[int, list[str]]:
    """The lines of the (possibly chained) traceback starting at ``start``; the next index."""
    i, block = start, []
    while i < len(lines):
        line = _strip(lines[i])
        block.append(line)
        i += 1
        if line == TRACEBACK_HEAD or line[:1] in (" ", "\t"):
            continue
        # the exception line; a chained traceback may follow after a blank line
        rest = [_strip(x) for x in lines[i : i + 4]]
        if len(rest) >= 3 and rest[0] == "" and rest[1] in _CHAINED and rest[2] == "":
            block.extend(rest[:3])
            i += 3
            continue
        break
    return i, block


def _from_traceback(source: str, block: list[str], into: Logged | None) -> Logged:
    frames = [m for m in map(_FRAME.match, block) if m]
    last = block[-1].strip() if block else ""
    kind = _EXC_LINE.match(last)
    found = into if into is not None else Logged(source)
    found.exception = kind.group("type").rsplit(".", 1)[-1] if kind else ""
    found.exception_line = last
    found.traceback = "\n".join(block)[-_MAX_TRACEBACK:]
    if frames:
        found.where = f"{frames[-1].group('file')}:{frames[-1].group('line')}"
        found.function = frames[-1].group("func").strip()
    if not found.message:
        found.message = last
    return found


def scan_text(text: str, source: str) -> list[Logged]:
    """The tracebacks and ERROR/CRITICAL log lines in ``text``. A log line directly followed
    by a traceback is one error (``logger.exception``'s output); a traceback's message is the
    line just before it (``logging.lastResort``'s output: the message alone), else its
    exception line."""
    if TRACEBACK_HEAD not in text and "ERROR" not in text and "CRITICAL" not in text:
        return []
    lines = text.splitlines()
    found: list[Logged] = []
    waiting: Logged | None = None  # the log line just before, which a traceback may belong to
    previous = ""  # the line just before, when it is no error of its own
    i = 0
    while i < len(lines):
        line = _strip(lines[i])
        if line == TRACEBACK_HEAD:
            i, block = _traceback_block(lines, i)
            error = _from_traceback(source, block, waiting or Logged(source, message=previous))
            if waiting is None:
                found.append(error)
            waiting, previous = None, ""
            continue
        match = _LOG_LINE.match(line)
        if match:
            waiting = Logged(source, level=match.group("level"), message=line.strip())
            found.append(waiting)
        else:
            waiting, previous = None, line.strip()
        i += 1
    return found


class _Tee:
    """``sys.stderr`` for the block: every write goes on unchanged and is kept."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        if isinstance(text, str):
            self._parts.append(text)
        return int(self._target.write(text) or 0)

    def flush(self) -> None:
        self._target.flush()

    def text(self) -> str:
        return "".join(self._parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _Stream:
    """One child's stderr: a path, a regular file, a pipe, or an in-memory buffer."""

    def __init__(self, given: Any, timeout: float) -> None:
        self.given = given
        self.timeout = timeout
        self.path: str | None = None
        self.fd: int | None = None
        self.offset = 0
        if isinstance(given, (str, os.PathLike)):
            self.path = os.fspath(given)
            self.name = self.path
            self.offset = os.stat(self.path).st_size if os.path.exists(self.path) else 0
        elif hasattr(given, "fileno"):
            self.fd = given.fileno()
            self.name = str(getattr(given, "name", f"fd {self.fd}"))
            mode = os.fstat(self.fd).st_mode
            self.regular = stat.S_ISREG(mode)
            self.offset = os.fstat(self.fd).st_size if self.regular else 0
        elif hasattr(given, "getvalue"):
            self.name = type(given).__name__
            self.offset = len(given.getvalue())
        else:
            raise TypeError(
                "no_logged_errors: children_stderr= takes paths (str or os.PathLike), files or "
                f"pipes (objects with fileno()) or io.StringIO/BytesIO buffers; got {given!r}"
            )

    def read(self) -> str:
        data: bytes | str
        if self.path is not None:
            if not os.path.exists(self.path):
                return ""
            with open(self.path, "rb") as stream:
                size = os.fstat(stream.fileno()).st_size
                stream.seek(self.offset if size >= self.offset else 0)
                data = stream.read(_MAX_READ)
        elif self.fd is not None and self.regular:
            size = os.fstat(self.fd).st_size
            data = os.pread(self.fd, _MAX_READ, self.offset if size >= self.offset else 0)
        elif self.fd is not None:
            data = self._drain(self.fd)
        else:
            data = self.given.getvalue()[self.offset :]
        if isinstance(data, bytes):
            return data.decode("utf-8", "replace")
        return data

    def _drain(self, fd: int) -> bytes:
        """A pipe's bytes until EOF or the deadline (a writer still alive never hangs us)."""
        deadline = time.monotonic() + self.timeout
        parts: list[bytes] = []
        total = 0
        while total < _MAX_READ:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
        return b"".join(parts)


def _patterns(allow: Iterable[str | re.Pattern[str]] | str | re.Pattern[str]) -> list[Any]:
    if isinstance(allow, (str, re.Pattern)):
        allow = [allow]
    compiled = []
    for pattern in allow:
        if not isinstance(pattern, (str, re.Pattern)):
            raise TypeError(
                "no_logged_errors: allow= takes regular expressions (str or re.Pattern) "
                f"matched against the logger name, the message or the exception; got {pattern!r}"
            )
        try:
            compiled.append(re.compile(pattern))  # a compiled pattern comes back as it is
        except re.error as exc:
            raise ValueError(
                f"no_logged_errors: allow= pattern {pattern!r} is not a regular expression ({exc})"
            ) from None
    return compiled


class ErrorWatch:
    """Collects the errors logged or printed while it is started (also the guard's
    ``--shutdown-quiet``). ``tee_stderr`` puts a tee on ``sys.stderr``; ``children`` are the
    child streams read at the end."""

    def __init__(
        self,
        *,
        allow: Iterable[str | re.Pattern[str]] | str | re.Pattern[str] = (),
        children_stderr: Iterable[Any] = (),
        tee_stderr: bool = True,
        level: int = logging.ERROR,
        timeout: float = 2.0,
    ) -> None:
        self.allow = _patterns(allow)
        if isinstance(children_stderr, (str, os.PathLike)) or hasattr(children_stderr, "fileno"):
            children_stderr = [children_stderr]
        self.level = level
        self.children = [_Stream(given, timeout) for given in children_stderr]
        self.tee_stderr = tee_stderr
        self.records: list[logging.LogRecord] = []
        self._tee: _Tee | None = None
        self._original: Any = None
        self._wrapper: Any = None
        self._active = False
        self._texts: list[tuple[str, str]] = []

    def start(self) -> ErrorWatch:
        original = logging.Logger.callHandlers
        records, level, watch = self.records, self.level, self

        def callHandlers(self: logging.Logger, record: logging.LogRecord) -> None:  # noqa: N802
            __tracebackhide__ = True  # the user's traceback is as without the helper
            if watch._active and record.levelno >= level:
                records.append(record)  # list.append: safe from any thread
            original(self, record)

        self._original, self._wrapper, self._active = original, callHandlers, True
        logging.Logger.callHandlers = callHandlers  # type: ignore[method-assign,assignment]
        if self.tee_stderr:
            self._tee = _Tee(sys.stderr)
            sys.stderr = self._tee  # type: ignore[assignment]
        return self

    def stop(self) -> None:
        """Uninstall what :meth:`start` installed (a wrapper another tool wrapped again stays
        in place, inert, so that theirs keeps working), then read the children's streams."""
        self._active = False
        if logging.Logger.callHandlers is self._wrapper:
            logging.Logger.callHandlers = self._original  # type: ignore[method-assign]
        if self._tee is not None:
            if sys.stderr is self._tee:
                sys.stderr = self._tee._target
            self.add_text(self._tee.text(), "stderr")
            self._tee = None
        for child in self.children:
            self.add_text(child.read(), f"child stderr {child.name}")

    def add_text(self, text: str, source: str) -> None:
        """More text to scan (the guard adds a teardown's captured stderr)."""
        if text:
            self._texts.append((text, source))

    def errors(self) -> list[Logged]:
        """What was seen, the allowed left out; a traceback or line in a stream that repeats a
        record seen in this process (a StreamHandler's output) is that record."""
        logged = [Logged.of_record(r) for r in self.records]
        exc_lines = {x.exception_line for x in logged if x.exception_line}
        messages = [x.message for x in logged if x.message]
        seen = list(logged)
        for text, source in self._texts:
            for error in scan_text(text, source):
                if error.exception_line and error.exception_line in exc_lines:
                    continue
                if not error.traceback and any(m in error.message for m in messages):
                    continue
                seen.append(error)
        return [x for x in seen if not self._allowed(x)]

    def _allowed(self, error: Logged) -> bool:
        fields = (error.logger, error.message, error.exception_line)
        return any(p.search(f) for p in self.allow for f in fields if f)

    def findings(self, subject: str) -> list[Finding]:
        """One ``shutdown-logged-error`` per distinct error, identical ones merged."""
        merged: dict[tuple[str, ...], tuple[Logged, int]] = {}
        for error in self.errors():
            first, count = merged.get(error.key(), (error, 0))
            merged[error.key()] = (first, count + 1)
        return [_finding(error, count, subject) for error, count in merged.values()]


def _short(text: str) -> str:
    text = text.strip().splitlines()[0] if text.strip() else ""
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _finding(error: Logged, count: int, subject: str) -> Finding:
    times = f" ({count} times)" if count > 1 else ""
    exc = f" with {error.exception}" if error.exception else ""
    where = f" at {error.where}" if error.where else ""
    if error.source == "log":
        message = (
            f"logger {error.logger!r} logged {error.level} {_short(error.message)!r}{exc}{where} "
            f"during {subject}{times}."
        )
    elif error.traceback and error.message != error.exception_line:
        message = (
            f"{error.source} shows {_short(error.message)!r} with a traceback of "
            f"{error.exception or 'an exception'}{where} during {subject}{times}."
        )
    elif error.traceback:
        message = (
            f"{error.source} shows a traceback ending in {_short(error.exception_line)!r}{where} "
            f"during {subject}{times}."
        )
    else:
        message = (
            f"{error.source} shows the {error.level} line {_short(error.message)!r} during "
            f"{subject}{times}."
        )
    return Finding("shutdown-logged-error", message, error.details(count))


@contextmanager
def no_logged_errors(
    *,
    allow: Iterable[str | re.Pattern[str]] | str | re.Pattern[str] = (),
    children_stderr: Iterable[Any] = (),
    timeout: float = 2.0,
) -> Iterator[ErrorWatch]:
    """Fail with ``shutdown-logged-error`` when the block logs an ERROR, prints a traceback to
    ``sys.stderr``, or a child process writes one to the stderr given in ``children_stderr``.

    ``allow``: regular expressions searched in the logger name, the message and the exception
    line; a match is not an error. ``children_stderr``: paths (read from where the file ended
    when the block began), files, pipes (read until EOF or ``timeout`` seconds at the end) or
    ``io.StringIO`` buffers. WARNING and below are never errors. When the block raises, its
    exception propagates unchanged and nothing is checked.

    Example::

        with no_logged_errors(children_stderr=[tmp_path / "engine.err"]):
            await engine.aclose()
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    watch = ErrorWatch(allow=allow, children_stderr=children_stderr, timeout=timeout)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()
    findings = watch.findings("the block")
    if findings:
        raise ShutdownContractError(findings)
