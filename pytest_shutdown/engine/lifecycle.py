"""LifecycleLog: one JSON line per lifecycle event of an engine process, for tests to read."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class LifecycleLog:
    """Appends one JSON line per event to ``path`` (nothing when ``path`` is None)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def event(self, name: str, **fields: Any) -> None:
        if self.path is None:
            return
        record = {"event": name, "t": time.time(), "pid": os.getpid(), **fields}
        line = json.dumps(record, default=repr) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    @staticmethod
    def read(path: str) -> list[dict[str, Any]]:
        try:
            with open(path, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []
