"""A graceful shutdown is quiet: ``no_logged_errors`` around the shutdown call.

vLLM #48745: a graceful ``AsyncLLM.shutdown()`` woke the output handler, which took the closed
engine for a dead one and logged ``"AsyncLLM output_handler failed."`` with an
``EngineDeadError`` traceback. The shutdown succeeded; only the log said otherwise. Here the
front end's output handler tells a requested stop from a death, and its engine process writes its
stderr to a file the check reads (``children_stderr``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

from pytest_shutdown import no_logged_errors

logger = logging.getLogger("frontend")

ENGINE_CORE = "import sys; sys.stdin.read(); print('INFO EngineCore stopped', file=sys.stderr)"


class Frontend:
    """A front end with an output-handler thread and one engine process."""

    def __init__(self, stderr_path: Path) -> None:
        with open(stderr_path, "ab") as stderr:  # the child keeps its own descriptor
            self.core = subprocess.Popen(
                [sys.executable, "-c", ENGINE_CORE], stdin=subprocess.PIPE, stderr=stderr
            )
        self.stopping = threading.Event()
        self.handler = threading.Thread(target=self._output_handler, name="output_handler")
        self.handler.start()

    def _output_handler(self) -> None:
        code = self.core.wait()  # the engine's outputs end when it exits
        if not self.stopping.is_set():  # a death, not a requested stop: worth an ERROR
            logger.error("EngineCore died with exit code %s", code)

    def shutdown(self) -> None:
        self.stopping.set()
        assert self.core.stdin is not None
        self.core.stdin.close()  # the engine's graceful stop
        self.core.wait(30)
        self.handler.join(30)


def test_the_graceful_shutdown_logs_no_error(tmp_path: Path) -> None:
    engine_stderr = tmp_path / "engine_core.err"
    engine = Frontend(engine_stderr)
    with no_logged_errors(children_stderr=[engine_stderr], allow=[r"^frontend\.metrics$"]):
        engine.shutdown()
