"""Process trees that hold shared memory or a socket file, for the tree checks' resource tests.

Like ``tree_subjects``: each runs as the root of a tree a ``TreeLauncher`` started, every child
watches its parent, nothing outlives the launcher.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from pytest_shutdown._os.phases import report_phase
from pytest_shutdown.engine.lifeline import set_process_name
from pytest_shutdown.engine.shm_ring import ShmRing, segment_name, unlink_segment
from pytest_shutdown.engine.stop_flag import SignalStop

LIFETIME_S = 60.0


def segment_child_tree(parent_unlinks: bool) -> int:
    """The root names a segment, a child creates it (vLLM's worker ring buffer) and waits; when
    the child dies the root unlinks the segment if ``parent_unlinks`` (the fix of vLLM #51579),
    then exits."""
    name = segment_name("child")
    root = os.getpid()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        set_process_name("seg_child")
        ring = ShmRing.create(name, slots=2, slot_bytes=64)
        os.write(ready_w, b"1")
        deadline = time.monotonic() + LIFETIME_S
        while os.getppid() == root and time.monotonic() < deadline:
            time.sleep(0.02)
        ring.close()
        ring.unlink()
        os._exit(0)
    os.read(ready_r, 1)
    report_phase("ready")
    os.waitpid(pid, 0)
    if parent_unlinks:
        unlink_segment(name)
    return 1


def socket_file_tree(path: str, remove: bool) -> int:
    """A root listening on a unix socket file; on SIGTERM it closes it and removes the file
    only if ``remove``."""
    stop = SignalStop()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    report_phase("ready")
    stop.wait(LIFETIME_S)
    server.close()
    if remove:
        os.unlink(path)
    return 0
