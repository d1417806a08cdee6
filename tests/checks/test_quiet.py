"""``no_logged_errors``: a graceful shutdown that logs an error or prints a traceback is found
(``shutdown-logged-error``, naming logger, message, exception type and file:line); one that logs
warnings, or only errors the test allows, is not. vLLM #48745's shape: the output handler, stopped
by a graceful shutdown, logs ``logger.exception("AsyncLLM output_handler failed.")`` with an
``EngineDeadError`` traceback although the shutdown succeeded.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest

from pytest_shutdown import ShutdownContractError, no_logged_errors
from pytest_shutdown.helpers.quiet import scan_text

LOGGER = "tests.quiet.async_llm"


class EngineDeadError(Exception):
    pass


class Frontend:
    """An engine front end whose output handler ends when the engine is shut down."""

    def __init__(self, *, log_on_stop: bool) -> None:
        self.log_on_stop = log_on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._output_handler, name="output_handler")
        self._thread.start()

    def _output_handler(self) -> None:
        self._stop.wait(10)
        try:
            raise EngineDeadError("EngineCore encountered an issue.")
        except EngineDeadError:
            if self.log_on_stop:  # the bug: a graceful stop is not an engine death
                logging.getLogger(LOGGER).exception("AsyncLLM output_handler failed.")

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _the_one(error: ShutdownContractError) -> dict[str, object]:
    assert error.codes == ["shutdown-logged-error"], error
    return dict(error.findings[0].details)


def test_an_exception_logged_by_a_graceful_shutdown_is_found_with_its_site() -> None:
    engine = Frontend(log_on_stop=True)
    with pytest.raises(ShutdownContractError) as caught:
        with no_logged_errors():
            engine.shutdown()
    details = _the_one(caught.value)
    assert details["logger"] == LOGGER
    assert details["message"] == "AsyncLLM output_handler failed."
    assert details["exception"] == "EngineDeadError"
    assert str(details["where"]).startswith(__file__ + ":")
    assert details["function"] == "_output_handler"
    assert details["thread"] == "output_handler"
    assert "raise EngineDeadError" in str(details["traceback"])
    message = caught.value.findings[0].message
    assert LOGGER in message and "EngineDeadError" in message and "output_handler failed" in message


def test_a_clean_graceful_shutdown_and_warnings_are_not_errors() -> None:
    engine = Frontend(log_on_stop=False)
    with no_logged_errors():
        logging.getLogger(LOGGER).warning("draining 2 requests")
        engine.shutdown()


def test_allowed_errors_are_not_findings() -> None:
    engine = Frontend(log_on_stop=True)
    with no_logged_errors(allow=[r"output_handler failed"]):
        engine.shutdown()
    with no_logged_errors(allow=r"^tests\.quiet\."):  # by logger name
        logging.getLogger(LOGGER).error("expected")
    with no_logged_errors(allow=["EngineDeadError"]):  # by exception
        Frontend(log_on_stop=True).shutdown()


def test_a_logger_that_does_not_propagate_is_seen_and_its_handlers_get_every_record() -> None:
    logger = logging.getLogger("tests.quiet.private")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    original = logging.Logger.callHandlers
    try:
        with pytest.raises(ShutdownContractError) as caught:
            with no_logged_errors():
                for _ in range(2):  # the same record twice: one finding, counted
                    logger.error("cleanup failed: %s", "socket")
                logger.warning("bye")
        assert logging.Logger.callHandlers is original  # restored
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    details = _the_one(caught.value)
    assert details["message"] == "cleanup failed: socket" and details["count"] == 2
    assert "(2 times)" in caught.value.findings[0].message
    assert stream.getvalue() == "cleanup failed: socket\ncleanup failed: socket\nbye\n"


def test_a_traceback_printed_to_stderr_is_found() -> None:
    with pytest.raises(ShutdownContractError) as caught:
        with no_logged_errors():
            try:
                raise RuntimeError("sockets closed from the wrong loop")
            except RuntimeError:
                traceback.print_exc()
    details = _the_one(caught.value)
    assert details["source"] == "stderr"
    assert details["exception"] == "RuntimeError"
    assert details["exception_line"] == "RuntimeError: sockets closed from the wrong loop"
    assert str(details["where"]).startswith(__file__ + ":")


def test_a_handler_writing_to_stderr_gives_one_finding_not_two() -> None:
    logger = logging.getLogger("tests.quiet.stderr")
    handler: logging.Handler | None = None
    try:
        with pytest.raises(ShutdownContractError) as caught:
            with no_logged_errors():
                handler = logging.StreamHandler()  # the block's sys.stderr: the tee
                logger.addHandler(handler)
                try:
                    raise EngineDeadError("gone")
                except EngineDeadError:
                    logger.exception("output handler failed")
    finally:
        if handler is not None:
            logger.removeHandler(handler)
    assert _the_one(caught.value)["source"] == "log"


CHILD = """
import sys, traceback
try:
    raise ConnectionError("EngineCore_DP0 lost its socket")
except ConnectionError:
    print("ERROR 12-05 10:00:00 [core.py:12] EngineCore failed to shut down.", file=sys.stderr)
    traceback.print_exc()
print("WARNING 12-05 10:00:00 [core.py:13] a warning is fine", file=sys.stderr)
"""


def test_a_traceback_in_a_child_stderr_file_is_found(tmp_path: Path) -> None:
    err = tmp_path / "engine.err"
    err.write_text("Traceback (most recent call last):\nOldError: before the block\n")
    with pytest.raises(ShutdownContractError) as caught:
        with open(err, "a") as sink, no_logged_errors(children_stderr=[err]):
            subprocess.run([sys.executable, "-c", CHILD], stderr=sink, timeout=60, check=True)
    details = _the_one(caught.value)  # the log line and its traceback are one error
    assert details["source"] == f"child stderr {err}"
    assert details["exception"] == "ConnectionError"
    assert "EngineCore failed to shut down." in str(details["message"])
    assert str(details["where"]) == "<string>:4"


def test_a_traceback_in_a_child_pipe_is_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stderr=subprocess.PIPE)
    try:
        with pytest.raises(ShutdownContractError) as caught:
            with no_logged_errors(children_stderr=[child.stderr], timeout=30):
                child.wait(60)
    finally:
        child.kill()
        child.wait(10)
        assert child.stderr is not None
        child.stderr.close()
    assert _the_one(caught.value)["exception"] == "ConnectionError"


def test_a_quiet_child_gives_nothing(tmp_path: Path) -> None:
    err = tmp_path / "engine.err"
    with open(err, "w") as sink, no_logged_errors(children_stderr=[err]):
        subprocess.run(
            [sys.executable, "-c", "import sys; print('INFO shutting down', file=sys.stderr)"],
            stderr=sink,
            timeout=60,
            check=True,
        )


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(TypeError, match="allow="):
        with no_logged_errors(allow=[3]):  # type: ignore[list-item]
            pass
    with pytest.raises(ValueError, match="allow= pattern"):
        with no_logged_errors(allow=["("]):
            pass
    with pytest.raises(TypeError, match="children_stderr="):
        with no_logged_errors(children_stderr=[3]):
            pass


def test_the_block_s_own_exception_propagates_and_the_hooks_are_removed() -> None:
    original, stderr = logging.Logger.callHandlers, sys.stderr
    with pytest.raises(KeyError):
        with no_logged_errors():
            logging.getLogger(LOGGER).error("not checked: the block raised")
            raise KeyError("boom")
    assert logging.Logger.callHandlers is original and sys.stderr is stderr


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("ERROR:root:boom", True),
        ("(EngineCore_DP0 pid=12) ERROR 12-05 10:00:00 [core.py:1] boom", True),
        ("2026-12-05 10:00:00,123 CRITICAL engine: boom", True),
        ("[ERROR] boom", True),
        ("2023-12-27 11:25:36 | ERROR | stderr | boom", True),
        ("WARNING:root:boom", False),
        ("no ERROR here, a sentence that mentions ERROR", False),
        ("ERRORS are counted: 0", False),
    ],
)
def test_the_log_lines_a_stream_is_scanned_for(line: str, found: bool) -> None:
    assert bool(scan_text(line + "\n", "stderr")) is found


def test_a_chained_traceback_is_one_error_with_the_last_exception() -> None:
    def inner() -> None:
        raise ValueError("first")

    try:
        try:
            inner()
        except ValueError as exc:
            raise RuntimeError("second") from exc
    except RuntimeError:
        text = traceback.format_exc()
    (error,) = scan_text(text, "stderr")
    assert error.exception == "RuntimeError" and error.exception_line == "RuntimeError: second"
