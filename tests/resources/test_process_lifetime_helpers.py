"""Process-lifetime helpers are recognised by what they are, not by a list of packages.

Real ``pytest -p shutdown`` runs in fail mode (subprocesses): the resource tracker of a fork
of multiprocessing (``multiprocess``, which vLLM's tests import) and pyzmq's process-wide
garbage-collector context (started by the first zero-copy send) are nobody's leak, while a
real child process, a zmq socket left open and a raw descriptor still are; a descriptor no
Python object wraps is described without blaming the test's own ``os`` calls.
"""

from __future__ import annotations

import json

import pytest

GRACE = "--shutdown-grace=0.5"


def _run_in_fail_mode(pytester: pytest.Pytester) -> pytest.RunResult:
    """The suite, the guard in fail mode, its report in report.json (see :func:`_findings`)."""
    return pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-guard=fail", GRACE, "--shutdown-report=report.json"
    )


def _findings(pytester: pytest.Pytester) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    report = json.loads((pytester.path / "report.json").read_text())
    found: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for test in report["tests"]:
        if test.get("findings"):
            found[test["nodeid"].rpartition("::")[2]] = test["findings"]
    return found


def test_a_fork_of_multiprocessings_resource_tracker_is_nobodys_leak(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("multiprocess")
    pytester.makepyfile(
        """
        import time

        import multiprocess as mp
        from multiprocess import shared_memory

        def test_a_semaphore_starts_the_tracker():
            sem = mp.get_context("spawn").Semaphore(1)  # registered with the tracker
            sem.acquire()
            sem.release()
            from multiprocess import resource_tracker
            assert resource_tracker._resource_tracker._pid is not None

        def test_shared_memory_uses_it():
            segment = shared_memory.SharedMemory(create=True, size=64)
            segment.close()
            segment.unlink()

        def test_a_real_child_is_still_a_leak():
            child = mp.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
            child.start()

        def test_clean():
            pass
        """
    )
    result = _run_in_fail_mode(pytester)
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_real_child_is_still_a_leak*",
            "shutdown guard: [[]process-leak]*",
        ]
    )
    found = _findings(pytester)
    assert set(found) == {"test_a_real_child_is_still_a_leak"}, found
    assert "resource_tracker import main" not in result.stdout.str()  # the tracker: no finding


def test_pyzmqs_garbage_collector_context_is_a_process_lifetime_helper(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("zmq")
    pytester.makepyfile(
        """
        import ctypes
        import os

        import zmq

        def test_a_zero_copy_send_starts_the_gc_context():
            ctx = zmq.Context()
            push, pull = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
            push.bind("inproc://zero-copy")
            pull.connect("inproc://zero-copy")
            push.send(b"x" * (1 << 20), copy=False)  # zero-copy: pyzmq's gc context starts
            assert len(pull.recv()) == 1 << 20
            from zmq.utils.garbage import gc
            assert gc.is_alive()
            push.close(linger=0)
            pull.close(linger=0)
            ctx.term()

        def test_a_zmq_socket_left_open_is_still_a_leak():
            ctx = zmq.Context()
            sock = ctx.socket(zmq.PUSH)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(sock))  # held where no owner reaches

        def test_a_raw_eventfd_is_described_without_blame():
            os.eventfd(0)

        def test_clean():
            pass
        """
    )
    result = _run_in_fail_mode(pytester)
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_zmq_socket_left_open_is_still_a_leak*",
            "shutdown guard: [[]fd-leak]*",
            "*ERROR at teardown of test_a_raw_eventfd_is_described_without_blame*",
            "shutdown guard: [[]fd-leak]*",
        ]
    )
    found = _findings(pytester)
    assert set(found) == {
        "test_a_zmq_socket_left_open_is_still_a_leak",
        "test_a_raw_eventfd_is_described_without_blame",
    }, found
    (socket_leak,) = found["test_a_zmq_socket_left_open_is_still_a_leak"]
    assert socket_leak["code"] == "fd-leak"
    kinds = sorted(r["kind"] for r in socket_leak["details"]["fds"])
    assert kinds == ["eventfd"] * 4 + ["eventpoll"] * 2  # the socket's and its context's
    for record in socket_leak["details"]["fds"]:  # given to the test's own context: no owner
        assert "it is libzmq's mailbox" in record["opened_by"], record
        assert "zmq.sugar.context.Context" in record["opened_by"], record
    (raw,) = found["test_a_raw_eventfd_is_described_without_blame"]
    assert "likely held by libzmq's native code" in raw["message"]
    (record,) = raw["details"]["fds"]
    assert record["likely_library"] == "libzmq"


def test_a_native_descriptor_is_described_without_blaming_the_tests_code(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import os

        def test_a_pipe_no_object_wraps():
            os.pipe()
        """
    )
    result = _run_in_fail_mode(pytester)
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "os.open" not in out and "os.pipe/" not in out
    (finding,) = _findings(pytester)["test_a_pipe_no_object_wraps"]
    message = finding["message"]
    assert "They have no Python object (native code or a raw os call)" in message
    assert "process-wide resource created on first use" in message
    for record in finding["details"]["fds"]:
        assert record["kind"] == "pipe" and record["native"] is True
        assert record["opened_by"].startswith("no Python object wraps this pipe")
        assert "os.open" not in record["opened_by"]
