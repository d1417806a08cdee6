"""A stop request a signal handler may set: ``SignalStop``, which takes no lock.

``threading.Event.set()`` in a signal handler can hang the process for good. Python runs the
handler in the main thread between two bytecodes, and the main thread may be inside that same
event's ``wait()`` (or ``set()``) at that moment, holding the event's internal lock: the handler's
``set()`` then waits for a lock only its own thread can release. The serving loop that waits on
the event 50 times a second hits that window now and then on a loaded machine (the reference
frontend did in CI: a SIGTERM that never stopped it). ``SignalStop`` keeps the request in a
plain attribute and waits by sleeping in short slices; a signal interrupts the sleep, its
handler sets the attribute, and the wait sees it within one slice.
"""

from __future__ import annotations

import time

#: How often ``SignalStop.wait`` looks at the request.
STOP_POLL_S = 0.01


class SignalStop:
    """Like ``threading.Event`` for one-way stop requests, safe to ``set()`` in a signal handler.

    ``set()`` is an attribute assignment (atomic under the GIL); ``wait()`` sleeps in slices of
    ``poll_s`` and returns as soon as it sees the request. Any thread may set or wait.
    """

    def __init__(self, poll_s: float = STOP_POLL_S) -> None:
        self.poll_s = poll_s
        self._requested = False

    def set(self) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the stop was requested, waiting at most ``timeout`` seconds (None: for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._requested:
            if deadline is None:
                time.sleep(self.poll_s)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self.poll_s, remaining))
        return True
