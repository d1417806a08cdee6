"""Moved to :mod:`pytest_shutdown._base.hidden` (issue 47: the resource kinds use it too, and
they sit below the helpers); its names stay importable from here."""

from __future__ import annotations

from pytest_shutdown._base.hidden import HiddenGeneratorContext, contextmanager

__all__ = ["HiddenGeneratorContext", "contextmanager"]
