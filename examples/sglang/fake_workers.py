"""The processes SGLang's launch code starts, with everything that needs a model replaced.

``Engine._launch_subprocesses`` starts ``run_scheduler_process_func`` and
``run_detokenizer_process_func`` with ``multiprocessing`` (spawn, as SGLang forces it) and calls
``init_tokenizer_manager_func`` in the parent. These stand-ins keep the parts of SGLang's real
workers that shutdown depends on: each calls SGLang's own ``kill_itself_when_parent_died``
(``PR_SET_PDEATHSIG``) first, the scheduler sends its ready message through SGLang's pipe, and
then each waits, as a worker with no requests does, until it is killed.

This module imports nothing of SGLang at import time: the spawned children import only
``sglang.srt.utils`` (for ``kill_itself_when_parent_died``) and what unpickling their arguments
needs.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

# the scheduler's ready message, as Scheduler.get_init_info() builds it
READY = {"status": "ready", "max_total_num_tokens": 64, "max_req_input_len": 32}
CRASH_ENV = "SGLANG_CHECK_CRASH_AFTER_S"  # a fake scheduler exits 1 this many seconds after ready


def fake_scheduler(
    server_args: Any,
    port_args: Any,
    gpu_id: int,
    tp_rank: int,
    pp_rank: int,
    dp_rank: int | None,
    pipe_writer: Any,
    *_display: Any,
) -> None:
    """``run_scheduler_process`` without a Scheduler: lifeline, ready message, idle loop."""
    import setproctitle
    from sglang.srt.utils import kill_itself_when_parent_died

    kill_itself_when_parent_died()
    setproctitle.setproctitle("sglang::scheduler")  # the name SGLang's own scheduler takes
    pipe_writer.send({**READY, "startup_time": None})
    crash_after = os.environ.get(CRASH_ENV)
    if crash_after is not None:
        time.sleep(float(crash_after))
        os._exit(1)  # a crash no Python handler sees, as an NCCL std::terminate()
    _idle()


def fake_detokenizer(server_args: Any, port_args: Any, *_: Any) -> None:
    """``run_detokenizer_process`` without a DetokenizerManager: lifeline and idle loop."""
    import setproctitle
    from sglang.srt.utils import kill_itself_when_parent_died

    kill_itself_when_parent_died()
    setproctitle.setproctitle("sglang::detokenizer")
    _idle()


class FakeTokenizerManager:
    """What ``Engine`` reads of its TokenizerManager during launch and shutdown."""

    def __init__(self) -> None:
        self.max_req_input_len: int | None = None
        self.startup_time: dict[str, Any] | None = None
        self._subprocess_watchdog: Any = None

    def set_startup_time(self, startup_time: dict[str, Any]) -> None:
        self.startup_time = startup_time


def fake_tokenizer_manager(server_args: Any, port_args: Any) -> tuple[FakeTokenizerManager, None]:
    """``init_tokenizer_manager`` without a tokenizer: no template manager either."""
    return FakeTokenizerManager(), None


def _idle() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        time.sleep(3600)
