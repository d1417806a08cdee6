"""``no_os_leaks``: file descriptors, ports and shared-memory segments a block leaves behind.

The helper form of the guard's ``fds``, ``ports`` and ``shm`` kinds::

    with no_os_leaks():
        server = start_server()
        server.shutdown()

raises :class:`~pytest_shutdown.findings.finding.ShutdownContractError` with ``fd-leak``,
``port-leak`` and ``shm-leak`` findings for what the block left after ``grace`` seconds (one
deadline). Creation sites are recorded while it runs, so a ``SharedMemory`` left is named by
the line that created it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from pytest_shutdown._base.hidden import contextmanager
from pytest_shutdown.findings.finding import Finding, raise_if_any

__all__ = ["os_resource_kinds", "no_os_leaks"]


def os_resource_kinds(*, fds: bool = True, ports: bool = True, shm: bool = True) -> list[Any]:
    """The OS-resource kinds, those asked for."""
    from pytest_shutdown.resources.fds import FdKind  # noqa: PLC0415
    from pytest_shutdown.resources.ports import PortKind  # noqa: PLC0415
    from pytest_shutdown.resources.shm import ShmKind  # noqa: PLC0415

    return [kind() for kind, on in ((FdKind, fds), (PortKind, ports), (ShmKind, shm)) if on]


@contextmanager
def no_os_leaks(
    *,
    fds: bool = True,
    ports: bool = True,
    shm: bool = True,
    grace: float = 2.0,
    subject: str = "the block",
) -> Iterator[None]:
    """Fail when the block leaves descriptors, ports or segments behind (see the module)."""
    __tracebackhide__ = True
    if (
        isinstance(grace, bool)
        or not isinstance(grace, (int, float))
        or not (math.isfinite(grace) and grace >= 0)
    ):
        raise ValueError(f"grace: expected a number of seconds >= 0, got {grace!r}")
    kinds = os_resource_kinds(fds=fds, ports=ports, shm=shm)
    from pytest_shutdown.ownership import origins  # noqa: PLC0415

    if shm:
        origins.install()  # counted: nested in a guarded run, the guard's recording goes on
    try:
        before = [kind.snapshot() for kind in kinds]
        yield
    finally:
        if shm:
            origins.uninstall()
    deadline = time.monotonic() + grace
    findings: list[Finding] = []
    for kind, snapshot in zip(kinds, before, strict=True):
        items = kind.new_since(snapshot)
        left = kind.settle(items, deadline) if items else []
        findings.extend(kind.findings(left, subject, grace=grace))
    raise_if_any(findings)
