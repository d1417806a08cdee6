"""Findings say what and where by default (issue 49 point 1), in real pytest runs: a leaked
process or thread names itself, its target and the call that started it; a port the attribute
holding its socket; a segment the call that created it; identical findings are one line with a
count; the code and the verdict are coloured as pytest colours its own; a hint names where the
rest is; the short summary's ERROR line carries the code and the object."""

from __future__ import annotations

import contextlib
import json
import os
import re
import textwrap

import pytest

from pytest_shutdown.findings.text import DETAILS_HINT

SEGMENT = f"psd_where_{os.getpid()}"

SUITE = textwrap.dedent(
    f"""
    import atexit, multiprocessing, os, socket, threading
    from multiprocessing import shared_memory

    stop = threading.Event()

    def work():
        stop.wait(30)

    class Engine:
        def start(self):
            self.proc = multiprocessing.Process(name="engine-worker", target=work, daemon=True)
            self.proc.start()

    class Pool:
        def start(self):
            self.thread = threading.Thread(name="pool-worker", target=work, daemon=True)
            self.thread.start()

    class Server:
        def __init__(self):
            self._sock = socket.create_server(("127.0.0.1", 0))
            self.peer = socket.create_connection(self._sock.getsockname())
            self.log = open(__file__)
            self._thread = threading.Thread(target=self.serve, name="serving", daemon=True)
            self._thread.start()

        def serve(self):
            stop.wait(30)

    class Store:
        def __init__(self):
            self.seg = shared_memory.SharedMemory(create=True, size=1024, name="{SEGMENT}")
            self.seg.close()

    class Held:
        def close(self):
            pass

    def test_process():
        Engine().start()

    def test_thread():
        Pool().start()

    def test_port():
        Server()

    def test_segment():
        Store()

    def test_atexit():
        for _ in range(5):
            atexit.register(Held().close)

    def test_zz_clean():
        os.unlink("/dev/shm/{SEGMENT}")
    """
)


RUN = ("-p", "shutdown", "-p", "no:randomly", "--shutdown-grace=0.3")


def _line_of(source: str, text: str) -> int:
    """The line number of ``text`` in the file pytester writes (``source`` stripped)."""
    return 1 + source.strip().splitlines().index(text)


def _section(out: str) -> list[str]:
    """The lines of the ``shutdown`` section."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if " shutdown " in line and "====" in line)
    end = next(i for i in range(start + 1, len(lines)) if "=====" in lines[i])
    return lines[start + 1 : end]


@pytest.fixture
def where_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # pytest trims a short summary line to the terminal's width: a wide one shows it all
    monkeypatch.setenv("COLUMNS", "400")
    for name in ("CI", "BUILD_NUMBER"):  # on CI it would print the whole error block
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_where=SUITE)
    yield pytester
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"/dev/shm/{SEGMENT}")


def test_each_finding_names_its_object_and_where_it_was_made(
    where_suite: pytest.Pytester,
) -> None:
    result = where_suite.runpytest_subprocess(*RUN, "--color=no", "--shutdown-report=r.json")
    result.assert_outcomes(passed=6, errors=5)
    out = result.stdout.str()
    section = "\n".join(_section(out))
    started = _line_of(SUITE, "        self.proc.start()")
    assert (
        "test_where.py::test_process: [process-leak] 1 child process started in test_process "
        "still running after the 0.3 s grace: "
    ) in section, section
    assert (
        f"(Process 'engine-worker', target test_where.work, started by Engine.start at "
        f"test_where.py:{started})."
    ) in section, section
    started = _line_of(SUITE, "        self.thread.start()")
    assert (
        f"'pool-worker' (target test_where.work, started by Pool.start at test_where.py:{started})."
    ) in section, section
    assert "'serving' (target test_where.Server.serve, started by Server.__init__" in section
    assert "TCP socket listening on 127.0.0.1:" in section
    assert "held by Server._sock in this process." in section, section
    assert re.search(
        r"fd \d+: TCP socket 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:\d+ held by Server\.peer", section
    )
    assert re.search(r"fd \d+: file \S+test_where\.py \(read\) held by Server\.log", section)
    created = _line_of(
        SUITE,
        f'        self.seg = shared_memory.SharedMemory(create=True, size=1024, name="{SEGMENT}")',
    )
    assert (
        f"/dev/shm/{SEGMENT}, 1024 bytes, created by Store.__init__ at test_where.py:{created}"
        in section
    )
    # five identical findings, one line
    (atexit_line,) = [line for line in section.splitlines() if "[atexit-holds-object]" in line]
    assert atexit_line.endswith("(5 times)"), atexit_line
    block = [line for line in out.splitlines() if line.startswith("[atexit-holds-object] ")]
    assert len(block) == 1 and block[0].endswith(" (5 times)"), block  # the error block
    assert DETAILS_HINT in _section(out)
    assert "--shutdown-details" in DETAILS_HINT and "docs/codes.md" in DETAILS_HINT
    assert "\x1b[" not in out
    result.stdout.fnmatch_lines(
        [
            "ERROR test_where.py::test_process - shutdown guard: [[]process-leak] * (Process "
            "'engine-worker', target test_where.work, started by Engine.start at test_where.py:*)",
            "ERROR test_where.py::test_port - shutdown guard: [[]thread-leak] 'serving' *; "
            "[[]fd-leak] fd *: TCP socket 127.0.0.1:* held by Server.peer; *",
            "ERROR test_where.py::test_atexit - shutdown guard: [[]atexit-holds-object] "
            "atexit.register(test_where.Held.close) in test_atexit (by test_atexit at "
            "test_where.py:*) keeps test_where.Held alive * (5 times)",
        ]
    )
    # the JSON report keeps every finding and gains the facts the messages are made of
    report = json.loads((where_suite.path / "r.json").read_text())
    found = {t["nodeid"].split("::")[1]: t["findings"] for t in report["tests"]}
    assert len(found["test_atexit"]) == 5
    (process,) = found["test_process"][0]["details"]["processes"]
    assert (
        process["site"]
        == f"Engine.start at test_where.py:{_line_of(SUITE, '        self.proc.start()')}"
    )
    (thread,) = found["test_thread"][0]["details"]["threads"]
    assert thread["target"] == "test_where.work" and thread["site"].startswith("Pool.start at ")
    (port,) = next(f for f in found["test_port"] if f["code"] == "port-leak")["details"]["ports"]
    assert port["holder"] == "Server._sock in this process"


LEAKS_A_THREAD = textwrap.dedent(
    """
    import threading

    stop = threading.Event()

    def test_leaks():
        threading.Thread(target=stop.wait, args=(30,), name="leaky", daemon=True).start()
    """
)


def test_the_code_and_the_verdict_are_coloured_as_pytest_colours_its_own(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_colour=LEAKS_A_THREAD)
    args = ("-p", "shutdown", "-p", "no:randomly", "--shutdown-grace=0.2")
    coloured = pytester.runpytest_subprocess(*args, "--color=yes")
    red = "\x1b[31m\x1b[1m"
    lines = _section(coloured.stdout.str())
    assert lines[0].startswith(f"{red}1 of 1 test with findings\x1b[0m (thread-leak: 1)"), lines
    assert lines[1].startswith(f"test_colour.py::test_leaks: {red}[thread-leak]\x1b[0m 1 thread"), (
        lines
    )
    plain = pytester.runpytest_subprocess(*args, "--color=no")
    assert "\x1b[" not in plain.stdout.str()


def test_details_keep_each_finding_and_need_no_hint(where_suite: pytest.Pytester) -> None:
    result = where_suite.runpytest_subprocess(*RUN, "--shutdown-details", "-k", "test_atexit")
    result.assert_outcomes(passed=1, errors=1)
    section = _section(result.stdout.str())
    assert sum("[atexit-holds-object]" in line for line in section) == 5, section
    assert DETAILS_HINT not in section
    assert "    site: test_atexit at test_where.py:" in "\n".join(section)


FORKED_AFTER_A_COMMAND = """
import os, subprocess, sys, time

def test_runs_a_command():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_forks_a_worker():
    if os.fork() == 0:  # as billiard's Process starts a pool worker: no start record knows it
        time.sleep(30)
        os._exit(0)
"""


def test_our_own_forked_child_is_not_said_to_descend_from_an_earlier_command(
    pytester: pytest.Pytester,
) -> None:
    """billiard's pool workers (forked by its own Process class) were described as started by
    an earlier test's ``subprocess.run``, "through its ancestor": the last recorded process
    started before them, which had ended long before."""
    pytester.makepyfile(test_fork=FORKED_AFTER_A_COMMAND)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "--shutdown-guard=fail", "--shutdown-grace=0.2", "--shutdown-details"
    )
    result.assert_outcomes(passed=2, errors=1)
    text = result.stdout.str()
    assert "[process-leak] 1 child process started in test_forks_a_worker" in text
    assert "test_runs_a_command" not in text.split("short test summary")[0]
    assert "through its ancestor" not in text and "first recorded ancestor" not in text
