"""A stop request a signal handler may set: ``SignalStop``, which takes no lock.

``threading.Event.set()`` in a signal handler can hang the process for good: the handler runs in
the main thread, which may be inside that event's ``wait()`` holding its internal lock (the
reference frontend did in CI: a SIGTERM that never stopped it). ``SignalStop`` keeps the request
in a plain attribute and waits by sleeping in short slices.
"""

from __future__ import annotations

import math
import time

STOP_POLL_S = 0.01


class SignalStop:
    """Like ``threading.Event`` for one-way stop requests, safe to ``set()`` in a signal handler."""

    def __init__(self, poll_s: float = STOP_POLL_S) -> None:
        self.poll_s = poll_s
        self._requested = False

    def set(self) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float | None = None) -> bool:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while not self._requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self.poll_s, remaining))
        return True
