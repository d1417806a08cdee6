"""Process trees for the tree-death helper's tests: small, torch-free, each with one behaviour.

They run as the root of a tree started by a ``TreeLauncher`` (a fork of it), so they live in an
importable module. Every child they start watches its parent (``getppid``) unless the test is
about a child that does not: nothing here can outlive the launcher, which kills its whole tree
when it stops.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

from pytest_shutdown._os.phases import report_phase
from pytest_shutdown.engine.lifeline import set_process_name
from pytest_shutdown.engine.stop_flag import SignalStop

#: How long a subject waits for the test's signal before giving up by itself.
SUBJECT_LIFETIME_S = 60.0


def _stop_on_sigterm() -> SignalStop:
    stop = SignalStop()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    return stop


def _child_with_lifeline(name: str, parent: int) -> None:
    set_process_name(name)
    deadline = time.monotonic() + SUBJECT_LIFETIME_S
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.02)
    os._exit(0)


def lifelined_tree(children: int = 2) -> int:
    """A root with ``children`` forks that exit as soon as the root is gone: a correct tree."""
    stop = _stop_on_sigterm()
    root = os.getpid()
    for i in range(children):
        if os.fork() == 0:
            _child_with_lifeline(f"tree_child{i}", root)
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def child_without_lifeline() -> int:
    """A root whose child ignores the root's death: the child is an orphan once the root dies."""
    stop = _stop_on_sigterm()
    if os.fork() == 0:
        set_process_name("deaf_child")
        time.sleep(SUBJECT_LIFETIME_S)
        os._exit(0)
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def double_forking_tree(scrub_env: bool = False) -> int:
    """A root whose child daemonizes a grandchild (fork, setsid, fork, exit) and dies.

    The grandchild leaves the root's session and is re-parented away from the tree;
    ``scrub_env`` also makes it exec ``sleep`` with an empty environment (no marker either).
    """
    stop = _stop_on_sigterm()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if scrub_env:
                os.execve("/bin/sleep", ["sleep", str(int(SUBJECT_LIFETIME_S))], {})
            set_process_name("escapee")
            time.sleep(SUBJECT_LIFETIME_S)
            os._exit(0)
        os._exit(0)
    os.wait()  # the middle process is gone: the grandchild is re-parented
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def _block_forever(event: threading.Event) -> None:
    event.wait()


def non_daemon_thread_at_exit() -> int:
    """SIGTERM ends ``main``, but a non-daemon thread nobody stops blocks the interpreter's exit."""
    stop = _stop_on_sigterm()
    threading.Thread(target=_block_forever, args=(threading.Event(),), name="stuck-worker").start()
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def _sleep_with_lifeline(parent: int) -> None:
    set_process_name("joined_child")
    _child_with_lifeline("joined_child", parent)


def untimed_join_at_exit() -> int:
    """SIGTERM ends ``main``; multiprocessing's exit then joins a non-daemon child, untimed."""
    stop = _stop_on_sigterm()
    child = multiprocessing.get_context("fork").Process(
        target=_sleep_with_lifeline, args=(os.getpid(),), daemon=False
    )
    child.start()
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def phases_in_order() -> int:
    """Reports ``loading`` then ``ready`` a little later, and prints its own log line."""
    stop = _stop_on_sigterm()
    report_phase("loading")
    time.sleep(0.3)
    print("model weights loaded", flush=True)
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def _return_leaving_a_thread() -> None:
    set_process_name("stuck_child")
    threading.Thread(target=_block_forever, args=(threading.Event(),), name="stuck").start()


def child_stuck_at_exit() -> int:
    """A child whose target returned but whose exit waits for a non-daemon thread, forever."""
    stop = _stop_on_sigterm()
    multiprocessing.get_context("fork").Process(target=_return_leaving_a_thread).start()
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0


def declares_its_phases() -> int:
    """Declares the phases it can reach (``wanted_phase(known=...)``), then reports ``ready``."""
    from pytest_shutdown.orphans import wanted_phase  # noqa: PLC0415

    stop = _stop_on_sigterm()
    wanted_phase(known=("starting", "ready"))
    report_phase("starting")
    report_phase("ready")
    stop.wait(SUBJECT_LIFETIME_S)
    return 0
