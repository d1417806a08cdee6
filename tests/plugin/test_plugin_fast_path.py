"""The guard's fast path on real runs: a clean test costs one fingerprint pass before and one
after, and the next test starts from the last clean baseline only when nothing moved in between.
Both sides: what happens between two tests is neither test's, and a leak right after a row of
clean tests (each starting from the reused baseline) is still found, on the right test."""

from __future__ import annotations

import textwrap

import pytest

GRACE = "--shutdown-grace=0.3"

BETWEEN_TESTS = textwrap.dedent(
    """
    import os, threading

    import pytest

    _stop = threading.Event()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(nodeid):
        # Between two tests (after the guard's check of one, before the next one's set-up):
        # a thread and a descriptor nobody holds, neither test's doing.
        # After a test that moved nothing, and after one whose check had to ask every kind
        # (its baseline for the next test then taken at the end of that check).
        for name in ("test_clean_first", "test_clean_after_the_gap"):
            if nodeid.endswith(name):
                threading.Thread(
                    target=_stop.wait, args=(30,), name=f"between-{name}", daemon=True
                ).start()
                os.open(__file__, os.O_RDONLY)

    def pytest_unconfigure(config):
        _stop.set()
    """
)

SUITE = textwrap.dedent(
    """
    import os, threading

    _stop = threading.Event()

    def test_clean_first():
        pass

    def test_clean_after_the_gap():
        # moves the fingerprints (a pid allocated), so every kind is asked against the baseline
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()

    def test_clean_again():
        pass

    def test_leaks_a_thread_and_a_descriptor():
        threading.Thread(target=_stop.wait, args=(30,), name="mine", daemon=True).start()
        os.open(__file__, os.O_RDONLY)

    def test_clean_last():
        _stop.set()
    """
)


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_what_starts_between_tests_is_no_tests_and_a_later_leak_is_found(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makeconftest(BETWEEN_TESTS)
    pytester.makepyfile(test_gap=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", f"--shutdown-guard={mode}", GRACE, "-p", "no:randomly", "-v"
    )
    out = result.stdout.str()
    if mode == "fail":
        result.assert_outcomes(passed=5, errors=1)
        result.stdout.fnmatch_lines(
            ["ERROR test_gap.py::test_leaks_a_thread_and_a_descriptor - shutdown guard: *"]
        )
    else:
        result.assert_outcomes(passed=5, warnings=1)
    assert "thread-leak" in out and "fd-leak" in out
    assert "'mine'" in out
    for clean in ("test_clean_first", "test_clean_after_the_gap", "test_clean_again"):
        assert f"ERROR at teardown of {clean}" not in out
        assert f"{clean} - shutdown guard" not in out
    assert "findings in 1 of 5 tests" in out or "1 of 5 tests" in out


ALLOWED_THEN_CLEAN = textwrap.dedent(
    """
    import threading

    import pytest

    _stop = threading.Event()

    @pytest.mark.allow_leaks(threads=True, reason="kept on purpose")
    def test_allowed_to_leave_a_thread():
        threading.Thread(target=_stop.wait, args=(30,), name="allowed", daemon=True).start()

    def test_clean_next():
        # moves the fingerprints: every kind is asked against the baseline it started from
        t = threading.Thread(target=len, args=((),))
        t.start()
        t.join()

    def test_clean_last():
        _stop.set()
    """
)


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_what_an_allowed_test_left_is_in_the_next_tests_baseline(
    pytester: pytest.Pytester, mode: str
) -> None:
    """A check that had to ask every kind and found nothing to report (an allowed leak) is the
    next test's baseline: taken then, with what the allowed test left in it."""
    pytester.makepyfile(test_allowed=ALLOWED_THEN_CLEAN)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", f"--shutdown-guard={mode}", GRACE, "-p", "no:randomly", "-v"
    )
    result.assert_outcomes(passed=3)
    assert "thread-leak" not in result.stdout.str()


def test_the_guards_error_is_reported_by_its_text_not_a_formatted_traceback(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard replaces its teardown error's report with the findings: pytest must not first
    format the traceback through its and pluggy's frames (tens of milliseconds per error,
    thrown away). The error is still a ShutdownContractError."""
    from _pytest._code.code import ExceptionInfo

    from pytest_shutdown import ShutdownContractError

    styles: list[str] = []
    real = ExceptionInfo.getrepr

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN002, ANN003, ANN202
        if isinstance(self.value, ShutdownContractError):
            styles.append(kwargs.get("style", "long"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ExceptionInfo, "getrepr", recording)
    pytester.makepyfile(
        """
        import atexit

        class Holder:
            def close(self):
                pass

        def test_registers():
            atexit.register(Holder().close)
        """
    )
    result = pytester.runpytest_inprocess("-p", "shutdown", "--tb=long", "-p", "no:randomly")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*shutdown guard: atexit-holds-object*"])
    assert styles == ["value"]
