"""A minimal stand-in for torchvision's C++ operators, for ``make sglang-check`` only.

Why: PyPI's torchvision wheel links its operators against CUDA torch, so on CPU torch they do
not load and ``import torchvision`` fails registering fakes for ops that do not exist.

``scripts/sglang-check`` copies this file into ``.venv-sglang`` with a ``.pth`` line that
imports it at start-up. It imports nothing heavy then: only when ``torchvision`` itself is
imported does it declare the two operator schemas torchvision registers fakes for
unconditionally (``nms``, ``qnms``), without kernels. Calling them raises; SGLang's shutdown
code never does. Nothing else of torchvision is replaced.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY: list[Any] = []  # the torch.library.Library must live as long as the process


def declare_the_operators() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` if torchvision's C++ did not."""
    import torch
    import torchvision.extension  # noqa: F401 - tries torchvision's own operators first

    if _LIBRARY or _has_schema("nms"):
        return  # they loaded (a CUDA torch): nothing to stand in for
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARY.append(library)


def _has_schema(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.torchvision, name).default  # noqa: B018 - raises when undeclared
    except (AttributeError, RuntimeError):
        return False
    return True


class _BeforeTorchvisionRegistersFakes(importlib.abc.MetaPathFinder):
    """Declares the operators just before ``torchvision._meta_registrations`` is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "torchvision._meta_registrations":
            sys.meta_path.remove(self)
            declare_the_operators()
        return None  # the real module is imported as usual


if not any(isinstance(f, _BeforeTorchvisionRegistersFakes) for f in sys.meta_path):
    sys.meta_path.insert(0, _BeforeTorchvisionRegistersFakes())
