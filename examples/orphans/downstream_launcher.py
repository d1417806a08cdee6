"""A downstream engine launcher, as a script: the tree-death helper runs it by its command line.

    python downstream_launcher.py --workers 2 [--without-death-pipe]

The launcher starts its workers with ``subprocess`` (``python downstream_launcher.py --worker
I``), reports ``ready`` once every worker said so, serves until SIGTERM/SIGINT or until a worker
dies, then stops the workers with one deadline and kills what is left. Each worker's stdin is a
pipe only the launcher holds: its death pipe. However the launcher dies, the worker reads EOF
and exits. ``--without-death-pipe`` puts the bug back: workers that never look at their pipe.
Nothing here imports pytest-shutdown: the phase line is printed by hand.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import threading
import time

PHASE_LINE = "[pytest-shutdown] phase: {}"
#: How long the launcher waits for its workers to start, and to stop.
WORKER_START_TIMEOUT_S = 30.0
WORKER_STOP_TIMEOUT_S = 5.0
#: Exit code of a worker whose launcher is gone.
EXIT_PARENT_GONE = 3


class Stop:
    """A stop request set by a signal handler. Not a threading.Event: its set() takes the event's
    lock, which the main thread may hold inside wait() when the handler runs: a deadlock."""

    def __init__(self) -> None:
        self.requested = False

    def is_set(self) -> bool:
        return self.requested

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.requested and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)
        return self.requested


def stop_on_signals() -> Stop:
    stop = Stop()

    def request(signum: int, frame: object) -> None:
        stop.requested = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request)
    return stop


def serve_worker(death_pipe: bool) -> int:
    stop = stop_on_signals()

    def exit_when_the_launcher_is_gone() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the launcher's end of the pipe is closed
        os._exit(EXIT_PARENT_GONE)

    if death_pipe:
        threading.Thread(target=exit_when_the_launcher_is_gone, daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stop.wait()
    return 0


def serve_launcher(count: int, death_pipe: bool) -> int:
    stop = stop_on_signals()
    command = [sys.executable, os.path.abspath(__file__), "--worker"]
    if not death_pipe:
        command.append("--without-death-pipe")
    workers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(count)
    ]
    try:
        if not wait_ready(workers, time.monotonic() + WORKER_START_TIMEOUT_S, stop):
            return 1
        print(PHASE_LINE.format("ready"), file=sys.stderr, flush=True)
        while not stop.wait(0.05):
            if any(w.poll() is not None for w in workers):
                return 1  # a worker died: stop the others
        return 0
    finally:
        stop_workers(workers)


def wait_ready(workers: list[subprocess.Popen[bytes]], deadline: float,
               stop: Stop) -> bool:
    pending = {w.stdout.fileno(): w for w in workers if w.stdout is not None}
    while pending and not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        readable, _, _ = select.select(list(pending), [], [], min(remaining, 0.1))
        for fd in readable:
            if not os.read(fd, 64):
                return False  # a worker exited while starting
            del pending[fd]
    return not pending


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    for worker in workers:
        try:
            worker.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(WORKER_STOP_TIMEOUT_S)
        for pipe in (worker.stdin, worker.stdout):
            if pipe is not None:
                pipe.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--worker", action="store_true", help="run as a worker")
    parser.add_argument("--without-death-pipe", action="store_true", help="the bug: no lifeline")
    args = parser.parse_args()
    death_pipe = not args.without_death_pipe
    return serve_worker(death_pipe) if args.worker else serve_launcher(args.workers, death_pipe)


if __name__ == "__main__":
    sys.exit(main())
