"""check_finalizers and assert_finalizes_on_gc: each finding caught, correct code not accused."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pytest
import shutdown_subjects as s

from pytest_shutdown import (
    Finding,
    ShutdownContractError,
    assert_finalizers_ok,
    assert_finalizes_on_gc,
)
from pytest_shutdown.helpers.finalization import check_finalizers

_KEPT: list[object] = []


def the_static_finding(renderer: Any) -> Finding:
    """``check_finalizers``' one finding on ``renderer``, whose wrong finalizer is detached
    before it is shut down."""
    try:
        (finding,) = check_finalizers(renderer)
    finally:
        renderer._finalizer.detach()
        renderer.shutdown()
    return finding


def test_correct_renderer_has_clean_finalizers_and_is_collected_with_every_cleanup() -> None:
    renderer = s.GoodRenderer()
    try:
        assert check_finalizers(renderer) == []
    finally:
        renderer.shutdown()
    report = assert_finalizes_on_gc(s.GoodRenderer)
    explicit = report.details["explicit_cleanups"]
    assert "mm_cache.close" in explicit and "_executor.shutdown" in explicit
    assert sorted(report.performed("gc")) == sorted(explicit)


def test_finalizer_bound_method_static_check() -> None:
    finding = the_static_finding(s.BoundMethodFinalizer())
    assert finding.code == "finalizer-bound-method"
    assert finding.details["func"].endswith("shutdown")


def test_assert_finalizers_ok_passes_on_correct_finalizers_and_counts_them() -> None:
    renderer = s.GoodRenderer()
    try:
        report = assert_finalizers_ok(renderer)
    finally:
        renderer.shutdown()
    assert report.check == "finalizers-ok"
    assert report.details["finalizers"] == 1


def test_assert_finalizers_ok_raises_the_findings_of_check_finalizers() -> None:
    renderer = s.BoundMethodFinalizer()
    try:
        expected = check_finalizers(renderer)
        with pytest.raises(ShutdownContractError) as exc:
            assert_finalizers_ok(renderer)
    finally:
        renderer._finalizer.detach()
        renderer.shutdown()
    assert exc.value.findings == expected and exc.value.codes == ["finalizer-bound-method"]
    assert "keeps the object alive so the finalizer never runs" in str(exc.value)


def test_finalizer_bound_method_is_diagnosed_when_not_collected() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(s.BoundMethodFinalizer, timeout=0.2)
    (finding,) = exc.value.findings
    assert finding.code == "finalizer-bound-method"
    chain = finding.details["backref_chain"]
    assert chain.startswith("module weakref")
    assert "['_registry']" in chain and ".func" in chain


def test_finalizer_holding_self_in_args_names_the_argument() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(s.SelfInArgsFinalizer, timeout=0.2)
    (finding,) = exc.value.findings
    assert finding.code == "finalizer-holds-object"
    assert finding.details["path"] == "args[0]"
    assert finding.details["func"] == "_shutdown_renderer"


def test_finalizer_holding_the_object_deep_inside_partial_and_closure() -> None:
    finding = the_static_finding(s.DeepHoldFinalizer())
    assert finding.code == "finalizer-holds-object"
    assert finding.details["path"] == "func.args[0].<closure holder>['renderers'][0]"


def _held_forever() -> s.GoodRenderer:
    renderer = s.GoodRenderer()
    _KEPT.append(renderer)
    return renderer


def test_not_collected_reports_the_backref_chain_to_the_module() -> None:
    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_finalizes_on_gc(_held_forever, timeout=0.2)
    finally:
        for renderer in _KEPT:
            renderer.shutdown()  # type: ignore[attr-defined]
        _KEPT.clear()
    (finding,) = exc.value.findings
    assert finding.code == "not-collected"
    chain = finding.details["backref_chain"]
    assert chain.splitlines()[0] == f"module {__name__}"
    assert "['_KEPT']" in chain and "[1]: GoodRenderer" in chain  # [0] is the shut-down twin


def test_not_collected_names_the_thread_frame_that_holds_it() -> None:
    release = threading.Event()
    holders: list[threading.Thread] = []

    def factory() -> s.GoodRenderer:
        renderer = s.GoodRenderer()

        def hold(obj: object = renderer) -> None:
            release.wait(timeout=30)

        thread = threading.Thread(target=hold, name="holder-thread")
        thread.start()
        holders.append(thread)
        return renderer

    try:
        with pytest.raises(ShutdownContractError) as exc:
            assert_finalizes_on_gc(factory, method="no_such_method", timeout=0.2)
    finally:
        release.set()
        for thread in holders:
            thread.join(timeout=10)
    (finding,) = exc.value.findings
    assert finding.code == "not-collected"
    assert "holder-thread" in finding.details["backref_chain"]


def test_cleanup_missing_when_gc_releases_less_than_shutdown() -> None:
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(s.NoGcFallback)
    missing = {f.details["cleanup"] for f in exc.value.findings}
    assert set(exc.value.codes) == {"cleanup-missing"}
    assert missing == {"_executor.shutdown", "mm_cache.close"}


def test_a_cycle_without_finalizer_is_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    report = assert_finalizes_on_gc(Node)
    assert report.details["explicit_cleanups"] == []


def test_a_leaked_object_is_released_by_the_helper() -> None:
    refs: list[weakref.ref[s.GoodRenderer]] = []
    caches: list[s.Cache] = []

    def factory() -> s.BoundMethodFinalizer:
        renderer = s.BoundMethodFinalizer()
        refs.append(weakref.ref(renderer))
        caches.append(renderer.mm_cache)
        return renderer

    with pytest.raises(ShutdownContractError):
        assert_finalizes_on_gc(factory, timeout=0.1)
    assert refs[-1]() is None  # its finalizer ran, the registry let go
    assert caches[-1].close_calls == 1


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), True])
def test_bad_timeout_is_rejected(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        assert_finalizes_on_gc(s.GoodRenderer, timeout=timeout)


def test_multiprocessing_finalize_bound_to_the_object_is_caught() -> None:
    from multiprocessing import util

    class Holder:
        def __init__(self) -> None:
            self.cache = s.Cache()
            self._final = util.Finalize(self, self.shutdown)

        def shutdown(self) -> None:
            self.cache.close()

    holder = Holder()
    try:
        (finding,) = check_finalizers(holder)
    finally:
        holder._final.cancel()
    assert finding.code == "finalizer-bound-method"


_unmapped: list[str] = []


def unmap_shared_memory() -> None:
    """A module-level cleanup only ``watch=`` can count."""
    _unmapped.append("unmapped")


class UnmapsOnlyOnShutdown(s.GoodRenderer):
    def shutdown(self) -> None:
        super().shutdown()
        unmap_shared_memory()


def test_watch_finds_a_cleanup_missing_from_the_gc_path() -> None:
    assert_finalizes_on_gc(UnmapsOnlyOnShutdown)  # unwatched, nothing differs
    with pytest.raises(ShutdownContractError) as exc:
        assert_finalizes_on_gc(UnmapsOnlyOnShutdown, watch=[unmap_shared_memory])
    (finding,) = exc.value.findings
    assert finding.code == "cleanup-missing"
    assert finding.details["cleanup"] == "unmap_shared_memory"
