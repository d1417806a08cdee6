"""``process-group-left``: a ``torch.distributed`` process group still initialised.

A default process group (``init_process_group``) or a group made with ``new_group`` that is
never destroyed keeps its communicators, its store connection and its threads until the
interpreter exits; the next ``init_process_group`` in the same process fails ("trying to
initialize the default process group twice"), and with nccl the exit itself can hang (vLLM
#19196). ``process_groups()`` lists the groups initialised in this process;
``assert_process_group_destroyed()`` fails when any is (or when the given ones are);
the guard reports the groups a test left that were not there before it (the
``process-groups`` kind: :mod:`pytest_shutdown.resources.process_groups`, which reads them).

Never imports torch: when ``torch.distributed`` was never imported, no group can exist.
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
