"""fd-leak, port-leak and shm-leak under the guard, with real pytest runs: both sides of each
code, owned resources never blamed, a descendant's segment, allow_leaks for the three kinds."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

GRACE = "--shutdown-grace=0.3"

SUITE = """
import os, socket, subprocess, sys
outer = "{outer}"
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
    name = f"psd_{os.getpid()}_plugin_test_{outer}"  # named by this process: its to unlink
    seg = shared_memory.SharedMemory(create=True, size=4096, name=name)
    seg.close()               # closed, never unlinked

def test_descendant_shm_leak():
    # the child names it after its parent (as the reference engine does), writes it, and dies
    code = "import os; open(f'/dev/shm/psd_{os.getppid()}_from_child_{outer}', 'wb').write(b'x')"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


@pytest.fixture
def resource_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_resources=SUITE.replace("{outer}", str(os.getpid())))
    yield pytester
    for name in _ours():
        # the inner run's resource tracker (a process of its own) may unlink it meanwhile
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def _ours() -> list[str]:
    """The segments the suite above left (their names end with this process's pid)."""
    suffix = f"_{os.getpid()}"
    return [n for n in os.listdir("/dev/shm") if n.startswith("psd_") and n.endswith(suffix)]


def test_each_code_is_caught_and_a_clean_test_passes(resource_suite: pytest.Pytester) -> None:
    result = resource_suite.runpytest_subprocess(
        "-p", "shutdown", GRACE, "--shutdown-report=report.json"
    )
    result.assert_outcomes(passed=5, errors=4)
    result.stdout.fnmatch_lines(
        [
            "ERROR test_resources.py::test_fd_leak - shutdown guard: [[]fd-leak]*",
            "ERROR test_resources.py::test_port_leak - shutdown guard: [[]port-leak]*",
            "ERROR test_resources.py::test_shm_leak - shutdown guard: [[]shm-leak]*",
            "ERROR test_resources.py::test_descendant_shm_leak - shutdown guard: *",
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
    assert f"_plugin_test_{os.getpid()}" in seg["name"] and seg["size"] == 4096
    (child,) = found["test_descendant_shm_leak"][0]["details"]["segments"]
    assert f"_from_child_{os.getpid()}" in child["name"] and child["holders"] == []
    # fail mode reports segments and never unlinks them (a library may still open one by name:
    # loky's reusable executor deadlocked when its semaphore was unlinked); what the inner run's
    # resource tracker did not unlink at its exit is cleaned here
    for name in _ours():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def test_warn_mode_reports_and_changes_nothing(resource_suite: pytest.Pytester) -> None:
    result = resource_suite.runpytest_subprocess("-p", "shutdown", "--shutdown-guard=warn", GRACE)
    result.assert_outcomes(passed=5, warnings=4)
    # left as it was (the SharedMemory one is unlinked by multiprocessing's resource tracker
    # when that run's process exits, with its "leaked shared_memory objects" warning)
    assert [n for n in _ours() if "_from_child_" in n]


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
                                 "shutdown guard: [[]fd-leak]*"])


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


def test_a_swapped_descriptor_is_found_and_the_next_test_blamed_for_its_own_only(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import os

        FIRST = os.open(__file__, os.O_RDONLY)
        SECOND = os.open(__file__, os.O_RDONLY)
        KEPT = []

        def _note(name, number):
            with open(name, "w") as out:
                out.write(str(number))

        def test_swaps_and_keeps():
            KEPT.append(open(__file__))   # a module global owns it: no test's leak
            os.close(FIRST)               # one opened, one closed: the count is as it was

        def test_swaps_and_leaks():
            _note("swapped", os.open(__file__, os.O_RDONLY))   # nothing closes it
            os.close(SECOND)

        def test_leaks():
            _note("leaked", os.open(__file__, os.O_RDONLY))
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", GRACE, "-p", "no:randomly", "--shutdown-report=r.json"
    )
    result.assert_outcomes(passed=3, errors=2)
    report = json.loads((pytester.path / "r.json").read_text())
    blamed = {
        t["nodeid"].rpartition("::")[2]: [
            r["fd"] for f in t["findings"] for r in f["details"]["fds"]
        ]
        for t in report["tests"]
        if t["findings"]
    }
    assert blamed == {
        "test_swaps_and_leaks": [int((pytester.path / "swapped").read_text())],
        "test_leaks": [int((pytester.path / "leaked").read_text())],
    }
