"""``gc.get_freeze_count()`` when the package was first imported (before any conftest): what the
interpreter froze by itself, not 0 everywhere (a bare CPython 3.12.1 starts with 375 tuples
frozen). The package's ``__init__`` imports this module before anything else of its own, so
that is when it is read; the owner search compares a later count with it."""

from __future__ import annotations

import gc

__all__ = ["FROZEN_AT_IMPORT"]

FROZEN_AT_IMPORT = gc.get_freeze_count()
