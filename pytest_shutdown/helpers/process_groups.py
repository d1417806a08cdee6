"""``process-group-left``: a ``torch.distributed`` process group still initialised.

A group never destroyed keeps its communicators, store connection and threads until exit; the
next ``init_process_group`` fails, and with nccl the exit itself can hang (vLLM #19196). The
groups are read by :mod:`pytest_shutdown.resources.process_groups`; never imports torch.
"""

from __future__ import annotations

from pytest_shutdown.findings.finding import raise_if_any
from pytest_shutdown.resources.process_groups import (
    GroupInfo,
    group_names,
    process_group_findings,
    process_groups,
)

__all__ = [
    "GroupInfo",
    "assert_process_group_destroyed",
    "group_names",
    "process_group_findings",
    "process_groups",
]


def assert_process_group_destroyed(subject: str = "the shutdown") -> None:
    """Fail with ``process-group-left`` when any process group of this process is initialised.

    Use it after an engine's (or a test's) shutdown: the default group and every group made
    with ``new_group`` must be destroyed (or aborted) by then.
    """
    __tracebackhide__ = True
    raise_if_any(process_group_findings(subject))
