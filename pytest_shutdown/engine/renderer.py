"""ReferenceRenderer: tokenization and multimodal preprocessing with a correct shutdown.

Every resource is registered on one ExitStack the moment it exists; the finalizer's func is the
ExitStack's ``close`` (never a bound method of ``self``, no argument holds ``self``); executors
are registered as ``callback(executor.shutdown, wait=False)``, never ``enter_context(executor)``,
whose ``__exit__`` blocks on running work.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, TypeVar

from pytest_shutdown.engine.config import EngineConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("pytest_shutdown.engine")

T = TypeVar("T")

IMAGE_SIZE = 16
_MEAN = (0.48145466, 0.4578275, 0.40821073)
_STD = (0.26862954, 0.26130258, 0.27577711)


class ByteTokenizer:
    """A byte-level tokenizer: one token per UTF-8 byte (vocabulary of 256)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t % 256 for t in token_ids).decode("utf-8", errors="replace")


class MMProcessorCache:
    """An LRU cache of preprocessed images, keyed by the image's content; ``close()`` drops it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self.close_calls = 0
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def get_or_compute(self, key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self._lock:
            if self._closed:
                raise RuntimeError("MMProcessorCache is closed")
            if key in self._items:
                self.hits += 1
                self._items.move_to_end(key)
                return self._items[key]
            self.misses += 1
        value = compute()
        with self._lock:
            if not self._closed:
                self._items[key] = value
                while len(self._items) > self.capacity:
                    self._items.popitem(last=False)
        return value

    def close(self) -> None:
        with self._lock:
            self.close_calls += 1
            self._closed = True
            self._items.clear()


class ReferenceRenderer:
    """Tokenizes on a thread pool and preprocesses images on a separate single-thread pool.

    Use ``shutdown()`` (idempotent, non-blocking) or simply drop the renderer: garbage
    collection runs the same cleanups once.
    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self._resources = ExitStack()
        # ExitStack.close is not safe against concurrent callers.
        self._shutdown_lock = threading.Lock()
        self._resources.callback(logger.info, f"[shutdown] {type(self).__name__}")
        self._closed = threading.Event()
        self._resources.callback(self._closed.set)
        self._finalizer = weakref.finalize(self, self._resources.close)

        self.tokenizer = ByteTokenizer()

        self._executor = ThreadPoolExecutor(
            max_workers=self.config.renderer_num_workers, thread_name_prefix="renderer-tok"
        )
        self._resources.callback(self._executor.shutdown, wait=False)

        # A separate single-thread pool, so tokenization never queues behind MM preprocessing.
        self._mm_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="renderer-mm")
        self._resources.callback(self._mm_executor.shutdown, wait=False)

        mm_cache = MMProcessorCache(self.config.mm_cache_size)
        self._resources.callback(mm_cache.close)
        self.mm_cache = mm_cache

    def shutdown(self) -> None:
        """Release the pools and the MM cache; every later call does nothing."""
        with self._shutdown_lock:
            self._resources.close()

    @property
    def is_shut_down(self) -> bool:
        return self._closed.is_set()

    def tokenize(self, text: str) -> Future[list[int]]:
        return self._executor.submit(self.tokenizer.encode, text)

    def detokenize(self, token_ids: list[int]) -> Future[str]:
        return self._executor.submit(self.tokenizer.decode, list(token_ids))

    def preprocess_image(self, image: torch.Tensor) -> Future[torch.Tensor]:
        """Resize to 3x16x16 and normalise, through the MM cache, on the MM pool."""
        cache = self.mm_cache
        return self._mm_executor.submit(
            lambda: cache.get_or_compute(_content_key(image), lambda: _preprocess(image))
        )

    async def tokenize_async(self, text: str) -> list[int]:
        return await asyncio.wrap_future(self.tokenize(text))

    async def detokenize_async(self, token_ids: list[int]) -> str:
        return await asyncio.wrap_future(self.detokenize(token_ids))

    async def preprocess_image_async(self, image: torch.Tensor) -> torch.Tensor:
        return await asyncio.wrap_future(self.preprocess_image(image))


def _content_key(image: torch.Tensor) -> str:
    data = image.detach().cpu().contiguous()
    digest = hashlib.blake2b(data.numpy().tobytes(), digest_size=16)
    digest.update(repr((tuple(data.shape), str(data.dtype))).encode())
    return digest.hexdigest()


def _preprocess(image: torch.Tensor) -> torch.Tensor:
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: N812, PLC0415

    x = image.detach().to(torch.float32)
    if x.dim() == 2:
        x = x.unsqueeze(0)
    if x.shape[0] == 1:
        x = x.expand(3, *x.shape[1:])
    if x.max() > 1.0:
        x = x / 255.0
    x = F.interpolate(x.unsqueeze(0), size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear")[0]
    mean = torch.tensor(_MEAN).view(3, 1, 1)
    std = torch.tensor(_STD).view(3, 1, 1)
    return (x - mean) / std
