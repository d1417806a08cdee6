"""assert_idempotent_shutdown: shutdown-raised and cleanup-repeated, caught and not accused."""

from __future__ import annotations

import pytest
import shutdown_subjects as s

from pytest_shutdown import ShutdownContractError, assert_idempotent_shutdown
from pytest_shutdown.helpers.idempotence import NothingCountedError


def _codes(exc: pytest.ExceptionInfo[ShutdownContractError]) -> list[str]:
    return exc.value.codes


def test_correct_renderer_passes_and_reports_each_cleanup_once() -> None:
    renderer = s.GoodRenderer()
    report = assert_idempotent_shutdown(renderer, calls=3)
    assert report.cleanups["_executor.shutdown"] == {"call 1": 1, "call 2": 0, "call 3": 0, "gc": 0}
    assert report.cleanups["mm_cache.close"]["call 1"] == 1
    assert set(report.performed("call 1")) == set(report.cleanups)
    assert report.performed("call 2") == report.performed("gc") == []
    assert renderer.mm_cache.close_calls == 1


def test_racing_first_round_on_a_serialised_shutdown_passes() -> None:
    report = assert_idempotent_shutdown(s.LockedShutdown(), threads=4)
    assert report.cleanups["mm_cache.close"]["call 1"] == 1


def test_cleanup_repeated_on_the_second_call_names_attribute_method_and_counts() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(s.RepeatsCleanup(), calls=2)
    by_cleanup = {f.details["cleanup"]: f for f in exc.value.findings}
    assert set(_codes(exc)) == {"cleanup-repeated"}
    cache = by_cleanup["mm_cache.close"]
    assert cache.details["attribute"] == "mm_cache"
    assert cache.details["method"] == "close"
    assert cache.details["counts"] == {"call 1": 1, "call 2": 1}
    assert "mm_cache.close" in cache.message


def test_shutdown_raised_names_the_call_and_keeps_the_traceback() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(s.RaisesSecondTime(), calls=3)
    raised = [f for f in exc.value.findings if f.code == "shutdown-raised"]
    assert [f.details["call"] for f in raised] == [2, 3]
    assert "cache already closed" in raised[0].details["traceback"]
    assert "RuntimeError" in raised[0].message


def test_racing_threads_that_both_run_a_cleanup_are_caught() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(s.RacyShutdown(), threads=4, calls=2)
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-repeated"
    assert finding.details["counts"]["call 1"] > 1


def test_gc_path_repeating_a_cleanup_is_caught() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(s.FinalizerRepeatsCleanup())
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-repeated"
    assert finding.details["counts"] == {"call 1": 1, "gc": 1}


def release_device_memory() -> None:
    """A module-level cleanup no attribute leads to: only ``watch=`` finds it."""


class ReleasesEveryTime:
    def shutdown(self) -> None:
        release_device_memory()


def test_watch_counts_a_cleanup_discovery_cannot_see() -> None:
    with pytest.raises(NothingCountedError, match="watch="):  # unwatched: never a silent pass
        assert_idempotent_shutdown(ReleasesEveryTime())
    with pytest.raises(ShutdownContractError) as exc:
        assert_idempotent_shutdown(ReleasesEveryTime(), watch=[release_device_memory], calls=2)
    (finding,) = exc.value.findings
    assert finding.details["counts"] == {"call 1": 1, "call 2": 1}


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"method": "stop"}, "method"),
        ({"calls": 1}, "calls"),
        ({"threads": -1}, "threads"),
        ({"watch": ["no_such.close"]}, "watch"),
    ],
)
def test_bad_arguments_name_the_option(kwargs: dict[str, object], names: str) -> None:
    renderer = s.GoodRenderer()
    try:
        with pytest.raises(ValueError, match=names):
            assert_idempotent_shutdown(renderer, **kwargs)  # type: ignore[arg-type]
    finally:
        renderer.shutdown()
