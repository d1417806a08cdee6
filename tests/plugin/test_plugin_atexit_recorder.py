"""The atexit recorder is the guard's for the session only, and a forked child inherits none of
it."""

from __future__ import annotations

import atexit
import builtins
import os

import pytest

from pytest_shutdown.ownership import atexit_calls


@pytest.fixture(autouse=True)
def _atexits_own_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests need atexit's own functions in place. An in-process pytester run earlier in
    this worker can still hold a recording (seen under a shuffled order; which run is not yet
    known): set it aside for the test, and put it back after."""
    wrappers = atexit_calls._wrappers
    if not wrappers.installs:
        return
    for owner, name, original, _wrapper, _own in wrappers._originals.values():
        monkeypatch.setattr(owner, name, original)
    monkeypatch.setattr(wrappers, "_originals", {})
    monkeypatch.setattr(wrappers, "installs", 0)
    monkeypatch.setattr(atexit_calls, "_registrations", [])


def test_recording_wraps_and_unwraps_atexit_register() -> None:
    original = atexit.register
    with atexit_calls.recording():
        assert atexit.register is not original

        def hook() -> None:
            pass

        atexit.register(hook)
        assert [r.func for r in atexit_calls.registrations()][-1] is hook
        atexit.unregister(hook)
        assert all(r.func is not hook for r in atexit_calls.registrations())
    assert atexit.register is original


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_gets_the_original_atexit_register() -> None:
    original = atexit.register
    with atexit_calls.recording():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report whether it has the original, then exit at once
            os.write(write, b"1" if atexit.register is original else b"0")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"1"


def test_the_guard_stops_recording_when_its_session_ends(pytester: pytest.Pytester) -> None:
    # an outer guard may record
    original, installs = atexit.register, atexit_calls._wrappers.installs
    pytester.makepyfile("import atexit\ndef test_x():\n    assert atexit.register is not ORIG")
    pytester.makeconftest("import atexit\nimport builtins\nbuiltins.ORIG = atexit.register")
    try:
        result = pytester.runpytest_inprocess("-p", "shutdown", "-p", "no:randomly")
    finally:
        vars(builtins).pop("ORIG", None)
    result.assert_outcomes(passed=1)  # recorded during the inner session
    assert atexit.register is original
    assert atexit_calls._wrappers.installs == installs
