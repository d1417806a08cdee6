"""The reference engine's asyncio front end: ``AsyncLLM`` over ZMQ, closed with ``aclose()``."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")
pytest.importorskip("zmq", reason="the async front end needs pyzmq")

from pytest_shutdown.engine import AsyncLLM, EngineConfig  # noqa: E402


def test_the_async_engine_serves_and_closes() -> None:
    async def serve() -> list[str | None]:
        config = EngineConfig(platform="cpu", kv_cache_bytes=1 << 16)
        async with AsyncLLM.from_config(config) as engine:
            outputs = [out async for out in engine.generate("hello", max_tokens=4)]
        await engine.aclose()  # idempotent: a second close does nothing
        return [out.finish_reason for out in outputs]

    assert asyncio.run(serve()) == [None, None, None, "length"]
