"""A downstream-style test of the bundled ReferenceRenderer, run by `make demo` under the guard.

The renderer is the known-good baseline: shut down explicitly or dropped, it leaves no thread
behind, and its multimodal cache is closed exactly once.
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown.engine import ReferenceRenderer  # noqa: E402


def test_renderer_shuts_down_once_and_leaves_nothing_behind() -> None:
    renderer = ReferenceRenderer()
    ids = renderer.tokenize("shutdown correctness").result(timeout=5)
    assert renderer.detokenize(ids).result(timeout=5) == "shutdown correctness"
    renderer.shutdown()
    renderer.shutdown()
    assert renderer.mm_cache.close_calls == 1


def test_a_dropped_renderer_is_finalized_by_the_gc() -> None:
    renderer = ReferenceRenderer()
    cache = renderer.mm_cache
    del renderer
    gc.collect()
    assert cache.close_calls == 1
