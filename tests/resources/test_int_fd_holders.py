"""A descriptor no Python object wraps, kept as a plain number by an object of pure Python
(multiprocessing's heap arenas: ``Arena.fd``): owned by what owns that object."""

from __future__ import annotations

import os
import sys

import pytest

from pytest_shutdown.resources.fds import int_fd_holders

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="descriptors are read from /proc (Linux)"
)


class _Holder:
    def __init__(self, fd: int) -> None:
        self.fd = fd


def test_the_object_keeping_a_descriptor_number_is_found() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    holder = _Holder(fd)
    try:
        assert int_fd_holders([fd]) == {fd: (holder, "fd")}
    finally:
        os.close(fd)


def test_a_number_two_objects_keep_is_nobodys() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    first, second = _Holder(fd), _Holder(fd)
    try:
        assert int_fd_holders([fd]) == {}
    finally:
        os.close(fd)
    del first, second


HEAP_ARENA = """
import multiprocessing as mp

def test_a_barrier_allocates_from_the_process_wide_heap():
    barrier = mp.get_context("fork").Barrier(3)  # an arena of multiprocessing.heap
    del barrier

def test_a_number_kept_by_a_test_local_object_is_the_tests():
    import os
    class Keeper:
        def __init__(self, fd):
            self.fd = fd
    test_a_number_kept_by_a_test_local_object_is_the_tests.keeper = None
    KEEP.append(Keeper(os.open(os.devnull, os.O_RDONLY)))

KEEP = []
"""


def test_multiprocessings_heap_arena_is_owned_and_a_tests_own_number_still_blamed(
    pytester: pytest.Pytester,
) -> None:
    """vLLM's tensor IPC test: ``Barrier(3)`` made an arena whose descriptor
    ``BufferWrapper._heap`` keeps for the life of the process; it was an ``fd-leak`` with "no
    Python object". The other side: a number a test keeps in its own (global-held) object is
    owned by that global, listed as long-lived, not blamed either; a bare ``os.pipe`` is."""
    pytester.makepyfile(test_heap=HEAP_ARENA)
    pytester.makepyfile(
        test_bare="import os\n\ndef test_bare_descriptor():\n    os.pipe()\n"
    )
    result = pytester.runpytest_subprocess("-p", "shutdown", "-p", "no:randomly", timeout=90)
    out = result.stdout.str()
    assert "test_a_barrier_allocates_from_the_process_wide_heap: [fd-leak]" not in out
    result.stdout.fnmatch_lines(["*test_bare_descriptor: [[]fd-leak[]]*"])
    result.assert_outcomes(passed=3, errors=1)
