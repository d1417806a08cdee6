"""Benchmark figures as data: each benchmark module returns them, ``run.py`` gathers and tabulates.

A ``Figure`` is one measured number with its unit and, when the issue sets one, its target. A
module run with ``--json PATH`` also writes its figures there, so that ``run.py`` (which runs
every module in a fresh interpreter) can print one summary. Nothing here is a test: a missed
target is reported, never asserted.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figure:
    """One measured number; ``limit`` with ``at_least`` is the target, when there is one."""

    name: str
    value: float
    unit: str
    limit: float | None = None
    #: True: the target is ``value >= limit`` (a speed-up); False: ``value <= limit`` (a cost).
    at_least: bool = False
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.limit is None:
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    @property
    def target(self) -> str:
        if self.limit is None:
            return ""
        return f"{'>=' if self.at_least else '<='} {_number(self.limit)} {self.unit}"

    @property
    def verdict(self) -> str:
        return {None: "", True: "met", False: "NOT MET"}[self.met]


def median_ms(seconds: Sequence[float]) -> float:
    """The median of ``seconds``, in milliseconds."""
    return statistics.median(seconds) * 1000


def spread_ms(seconds: Sequence[float]) -> str:
    """``min-max`` of ``seconds`` in milliseconds, for the notes."""
    return f"{min(seconds) * 1000:.0f}-{max(seconds) * 1000:.0f} ms"


def write_json(path: str | Path, figures: Iterable[Figure]) -> None:
    Path(path).write_text(json.dumps([asdict(f) for f in figures], indent=1), encoding="utf-8")


def report(figures: list[Figure], json_path: str | None, value_format: str = ".3f") -> list[Figure]:
    """Print each figure (with its target and verdict where it has one) and, given a path, write
    them there as JSON (``--json``): what a module's ``main`` returns."""
    for figure in figures:
        verdict = f"  [{figure.verdict}: {figure.target}]" if figure.limit is not None else ""
        print(f"{figure.name}: {figure.value:{value_format}} {figure.unit}{verdict}")
    if json_path:
        write_json(json_path, figures)
    return figures


def read_json(path: str | Path) -> list[Figure]:
    return [Figure(**record) for record in json.loads(Path(path).read_text(encoding="utf-8"))]


def table(figures: Sequence[Figure]) -> str:
    """A plain-text table: figure, value, target, verdict."""
    rows = [("figure", "value", "target", "verdict")]
    rows += [(f.name, f"{_number(f.value)} {f.unit}", f.target, f.verdict) for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def markdown_table(figures: Sequence[Figure]) -> str:
    """The same table in Markdown (for benchmarks/README.md)."""
    lines = ["| figure | value | target | verdict |", "|---|---|---|---|"]
    lines += [
        f"| {f.name} | {_number(f.value)} {f.unit} | {f.target} | {f.verdict} |" for f in figures
    ]
    return "\n".join(lines)


def _number(value: float) -> str:
    if abs(value) < 2:  # ratios near a 1.10 target need the third decimal
        return f"{value:.3f}"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
