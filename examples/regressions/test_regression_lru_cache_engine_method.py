"""Growth 1: ``functools.lru_cache`` on an engine method (the shape of vLLM PR #46023).

The cache lives on the class and its keys hold ``self``: every engine ever built stays alive with
its pools and buffers, one more per build → use → shut down cycle. Fixed: the cached function is
a module-level one keyed by what it depends on (the tokenizer name), not by the engine.
"""

from __future__ import annotations

import functools

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth


class Tokenizer:
    def __init__(self, name: str) -> None:
        self.name = name


class CachedEngine:
    def __init__(self) -> None:
        self.kv_cache = bytearray(1 << 16)

    @functools.lru_cache  # noqa: B019 - the bug: self is part of every key (and 128 of them stay)
    def tokenizer_for(self, name: str) -> Tokenizer:
        return Tokenizer(name)

    def shutdown(self) -> None:
        self.kv_cache = bytearray()


@functools.lru_cache
def load_tokenizer(name: str) -> Tokenizer:
    """One tokenizer per name for the whole process, whichever engine asks."""
    return Tokenizer(name)


class FixedEngine(CachedEngine):
    def tokenizer_for(self, name: str) -> Tokenizer:  # type: ignore[override]
        return load_tokenizer(name)


def cycle(engine_class: type[CachedEngine]) -> None:
    engine = engine_class()
    engine.tokenizer_for("gpt2")
    engine.shutdown()


def expect(error: ShutdownContractError) -> None:
    """Re-raise the finding if it is the expected one; a wrong one fails the xfail test."""
    assert set(error.codes) == {"growth"}, error.codes
    first = error.findings[0].message
    assert first.startswith("CachedEngine: +1 per cycle (3 cycles); held by lru_cache wrapper")
    raise error


@pytest.mark.xfail(strict=True, raises=ShutdownContractError, reason="lru_cache keeps engines")
def test_buggy_engine_is_kept_by_its_method_cache() -> None:
    try:
        assert_no_growth(lambda: cycle(CachedEngine), cycles=3, warmup=1)
    except ShutdownContractError as error:
        expect(error)
    finally:
        CachedEngine.tokenizer_for.cache_clear()


def test_fixed_engine_leaves_nothing_behind() -> None:
    assert_no_growth(lambda: cycle(FixedEngine), cycles=3, warmup=1)
