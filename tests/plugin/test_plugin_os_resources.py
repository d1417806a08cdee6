"""fd-leak, port-leak and shm-leak under the guard, with real pytest runs: both sides of each
code, owned resources never blamed, a descendant's segment, allow_leaks for the three kinds."""

from __future__ import annotations

import json
import os

import pytest

GRACE = "--shutdown-grace=0.3"

SUITE = """
import os, socket, subprocess, sys
from multiprocessing import shared_memory

def test_clean():
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")  # process-lifetime helpers: never blamed
    p = ctx.Process(target=print)
    p.start(); p.join()
    r, w = os.pipe()
    os.close(r); os.close(w)
    with socket.create_server(("127.0.0.1", 0)):
        pass
    seg = shared_memory.SharedMemory(create=True, size=1024)
    seg.close(); seg.unlink()

def test_fd_leak():
    r, w = os.pipe()          # raw descriptors: nothing closes them
    os.close(r)

def test_port_leak():
    s = socket.create_server(("127.0.0.1", 0))
    s.detach()                # the listening socket stays open, owned by no object

def test_shm_leak():
    seg = shared_memory.SharedMemory(create=True, size=4096, name="psd_{pid}_plugin_test")
    seg.close()               # closed, never unlinked

def test_descendant_shm_leak():
    code = "open('/dev/shm/psd_{pid}_from_child', 'wb').write(b'x' * 100)"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


@pytest.fixture
def resource_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pid = os.getpid()
    pytester.makepyfile(test_resources=SUITE.replace("{pid}", str(pid)))
    yield pytester
    for name in (f"psd_{pid}_plugin_test", f"psd_{pid}_from_child"):
        try:
            os.unlink(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


def test_each_code_is_caught_and_a_clean_test_passes(resource_suite: pytest.Pytester) -> None:
    result = resource_suite.runpytest_subprocess(
        "-p", "shutdown", GRACE, "--shutdown-report=report.json"
    )
    result.assert_outcomes(passed=5, errors=4)
    result.stdout.fnmatch_lines(
        [
            "ERROR test_resources.py::test_fd_leak - shutdown guard: fd-leak",
            "ERROR test_resources.py::test_port_leak - shutdown guard: port-leak",
            "ERROR test_resources.py::test_shm_leak - shutdown guard: shm-leak",
            "ERROR test_resources.py::test_descendant_shm_leak - shutdown guard: shm-leak",
        ]
    )
    report = json.loads((resource_suite.path / "report.json").read_text())
    found = {t["nodeid"].split("::")[1]: t["findings"] for t in report["tests"]}
    assert set(found) == {"test_fd_leak", "test_port_leak", "test_shm_leak",
                          "test_descendant_shm_leak"}
    (fd,) = found["test_fd_leak"][0]["details"]["fds"]
    assert fd["kind"] == "pipe" and "write end" in fd["what"]
    (port,) = found["test_port_leak"][0]["details"]["ports"]
    assert port["address"].startswith("127.0.0.1:") and port["pid"] != os.getpid()
    (seg,) = found["test_shm_leak"][0]["details"]["segments"]
    assert seg["name"].endswith("_plugin_test") and seg["size"] == 4096
    (child,) = found["test_descendant_shm_leak"][0]["details"]["segments"]
    assert child["name"].endswith("_from_child") and child["holders"] == []
    # fail mode puts order back: the unheld segments were unlinked for the next test
    pid = os.getpid()
    assert not os.path.exists(f"/dev/shm/psd_{pid}_plugin_test")
    assert not os.path.exists(f"/dev/shm/psd_{pid}_from_child")


def test_warn_mode_reports_and_changes_nothing(resource_suite: pytest.Pytester) -> None:
    result = resource_suite.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn", GRACE)
    result.assert_outcomes(passed=5, warnings=4)
    assert os.path.exists(f"/dev/shm/psd_{os.getpid()}_plugin_test")  # left as it was


def test_without_the_plugin_the_suite_passes(resource_suite: pytest.Pytester) -> None:
    result = resource_suite.runpytest_subprocess()
    result.assert_outcomes(passed=5)


def test_allow_leaks_takes_the_three_kinds(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, socket
        import pytest

        @pytest.mark.allow_leaks(fds=True, reason="a descriptor kept on purpose")
        def test_fd_allowed():
            os.pipe()

        @pytest.mark.allow_leaks(ports=True, reason="a port kept on purpose")
        def test_port_allowed():
            socket.create_server(("127.0.0.1", 0)).detach()

        @pytest.mark.allow_leaks(shm=True, reason="not this kind")
        def test_other_kind_still_caught():
            os.pipe()
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_other_kind_still_caught*",
                                 "shutdown guard: fd-leak"])


def test_a_bad_allow_leaks_value_is_a_collection_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.allow_leaks(shm="yes", reason="bad")
        def test_x():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*shm= takes True or False, got 'yes'*"])


def test_owned_resources_are_not_the_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import socket, tempfile
        import pytest

        @pytest.fixture(scope="session")
        def server():
            s = socket.create_server(("127.0.0.1", 0))
            f = tempfile.TemporaryFile()
            yield s
            s.close()
            f.close()

        @pytest.fixture(scope="module")
        def lazy_holder():
            holder = []
            yield holder
            for s in holder:
                s.close()
        """
    )
    pytester.makepyfile(
        """
        import socket

        GLOBAL = []

        def test_uses_the_session_server(server):
            assert server.getsockname()

        def test_a_module_global_keeps_a_socket():
            GLOBAL.append(socket.create_server(("127.0.0.1", 0)))

        def test_a_wider_fixture_value_keeps_a_socket(lazy_holder):
            lazy_holder.append(socket.socket())

        def test_urandom_opened_lazily():
            open("/dev/urandom", "rb")  # a process-lifetime device file
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "-W", "ignore")
    result.assert_outcomes(passed=4)


def test_a_wider_fixture_that_leaks_at_teardown_is_blamed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os
        import pytest

        @pytest.fixture(scope="module")
        def channel():
            r, w = os.pipe()
            yield w
            os.close(w)       # the read end is forgotten

        def test_one(channel):
            pass

        def test_two(channel):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", GRACE, "--shutdown-report=r.json")
    result.assert_outcomes(passed=2, errors=1)
    report = json.loads((pytester.path / "r.json").read_text())
    (record,) = [t for t in report["tests"] if t["findings"]]
    (finding,) = record["findings"]
    assert finding["code"] == "fd-leak"
    assert "fixture 'channel' (module scope)" in finding["message"]
    assert finding["details"]["owner"]["fixture"] == "channel"
