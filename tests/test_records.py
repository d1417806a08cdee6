"""The record log's pure functions."""

from __future__ import annotations

import statistics

import pytest
from inner_runs import fresh_python

from pytest_shutdown.plugin.records import durations_summary


@pytest.mark.parametrize(
    "durations",
    [[0.5], [0.3, 0.1], [0.2, 0.9, 0.4], [0.4, 0.1, 0.3, 0.2], [0.0, 0.0, 1e-6, 2.5, 2.5]],
)
def test_the_durations_summary_has_the_median_statistics_gives(durations: list[float]) -> None:
    summary = durations_summary(durations)
    assert summary == {
        "count": len(durations),
        "median_s": round(statistics.median(durations), 6),
        "max_s": round(max(durations), 6),
        "total_s": round(sum(durations), 6),
    }


def test_no_durations_have_no_median() -> None:
    assert durations_summary([]) == {"count": 0, "median_s": None, "max_s": None, "total_s": 0.0}


def test_the_summary_imports_neither_statistics_nor_fractions() -> None:
    """Every session that writes a report or a summary makes one: ``statistics`` imports
    ``fractions``, which compiles a regular expression (some 4 ms)."""
    code = (
        "import sys; from pytest_shutdown.plugin.records import durations_summary; "
        "durations_summary([0.1, 0.2]); "
        "print(sorted(m for m in ('statistics', 'fractions') if m in sys.modules))"
    )
    assert fresh_python(code).strip() == "[]"
