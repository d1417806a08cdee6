"""What a native library keeps for the process's lifetime (``kept_by_libraries``): at a
wider-scope fixture's teardown it is listed as long-lived, not a finding (Ray's gRPC pollers and
log files after ``ray.shutdown()``). A fake library: a module always imported, a shared object
always mapped (the C library), an eventfd no Python object wraps."""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from pytest_shutdown.resources import fds
from pytest_shutdown.resources.fds import FdKind, kept_by_libraries, new_fds, take_fd_snapshot

pytestmark = pytest.mark.skipif(not hasattr(os, "eventfd"), reason="os.eventfd: Linux only")

FAKE = ("os", "libc", "the fake library", ("anon_inode:[[]eventfd[]]", "socket:[[]*[]]"))


def test_a_bare_descriptor_of_a_loaded_library_is_kept_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fds, "PROCESS_LIFETIME_NATIVE", (FAKE,))
    before = take_fd_snapshot()
    bare = os.eventfd(0)
    wrapped = socket.socket()  # a Python object wraps it: its holder's, whatever its target
    try:
        items = {item.fd: item for item in new_fds(before)}
        kept = FdKind().kept_by_libraries(list(items.values()))
        assert {item.fd: name for item, name in kept.items()} == {bare: "the fake library"}
    finally:
        os.close(bare)
        wrapped.close()


@pytest.mark.parametrize("entry", [
    ("not_imported_module_xyz", "libc", "never imported", ("anon_inode:*",)),
    ("os", "/no/such/library.so", "never mapped", ("anon_inode:*",)),
    ("os", "libc", "other targets", ("/dev/shm/*",)),
], ids=["module-not-imported", "not-mapped", "target-not-kept"])
def test_nothing_is_kept_otherwise(
    monkeypatch: pytest.MonkeyPatch, entry: tuple[str, str, str, tuple[str, ...]]
) -> None:
    monkeypatch.setattr(fds, "PROCESS_LIFETIME_NATIVE", (entry,))
    before = take_fd_snapshot()
    bare = os.eventfd(0)
    try:
        assert kept_by_libraries(new_fds(before)) == {}
    finally:
        os.close(bare)


CONFTEST = """
    import os
    import pytest
    from pytest_shutdown.resources import fds

    if {fake}:
        fds.PROCESS_LIFETIME_NATIVE = (
            ("os", "libc", "the fake library", ("anon_inode:[[]eventfd[]]",)),
        )
    KEPT = []

    @pytest.fixture(scope="session")
    def library():
        KEPT.append(os.eventfd(0))  # the library's first use: kept until the process exits
        yield
"""


@pytest.mark.parametrize("fake", [True, False], ids=["library-loaded", "no-library"])
def test_a_session_fixture_is_not_blamed_for_what_a_library_keeps(
    pytester: pytest.Pytester, fake: bool
) -> None:
    pytester.makeconftest(textwrap.dedent(CONFTEST.format(fake=fake)))
    pytester.makepyfile(test_uses="def test_uses(library):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "shutdown", "--shutdown-grace=0.2", "-rA")
    if fake:
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*long-lived resources (1,*"])
    else:  # any other bare descriptor a fixture leaves is its finding, as before
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*fd-leak*fixture 'library' (session scope)*eventfd*"])
