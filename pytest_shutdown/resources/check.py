"""``no_os_leaks``: file descriptors, ports and shared-memory segments a block leaves behind.

The helper form of the guard's ``fds``, ``ports`` and ``shm`` kinds::

    with no_os_leaks():
        server = start_server()
        server.shutdown()

raises :class:`~pytest_shutdown.findings.finding.ShutdownContractError` with ``fd-leak``,
``port-leak`` and ``shm-leak`` findings for what the block left after ``grace`` seconds (one
deadline). Creation sites are recorded while it runs, so a ``SharedMemory`` left is named by
the line that created it, and a ZMQ socket by its type, endpoints and creation line. With
``zmq`` (the default), a ``zmq.Context.term()`` called in the block that has not returned
after ``grace`` seconds because a socket is open or lingers is ``zmq-term-blocked`` (the
guard's probe, observing only; the guard does not report it again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from pytest_shutdown._base.hidden import contextmanager
from pytest_shutdown.findings.finding import Finding, raise_if_any

__all__ = ["os_resource_kinds", "no_os_leaks"]


def os_resource_kinds(
    *, fds: bool = True, ports: bool = True, shm: bool = True, zmq: float | None = None
) -> list[Any]:
    """The OS-resource kinds, those asked for (``zmq``: the zmq kind, its probe waiting that
    many seconds)."""
    from pytest_shutdown.resources.fds import FdKind  # noqa: PLC0415
    from pytest_shutdown.resources.ports import PortKind  # noqa: PLC0415
    from pytest_shutdown.resources.shm import ShmKind  # noqa: PLC0415

    kinds: list[Any] = [k() for k, on in ((FdKind, fds), (PortKind, ports), (ShmKind, shm)) if on]
    if zmq is not None:
        from pytest_shutdown.resources.zmq_sockets import ZmqKind  # noqa: PLC0415

        kinds.append(ZmqKind(deadline=zmq))
    return kinds


@contextmanager
def no_os_leaks(
    *,
    fds: bool = True,
    ports: bool = True,
    shm: bool = True,
    zmq: bool = True,
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
    kinds = os_resource_kinds(fds=fds, ports=ports, shm=shm, zmq=grace if zmq else None)
    from pytest_shutdown.ownership import origins  # noqa: PLC0415

    if shm:
        origins.install()  # counted: nested in a guarded run, the guard's recording goes on
    ended = False
    try:
        before = [kind.snapshot() for kind in kinds]
        yield
        ended = True
    finally:
        if shm:
            origins.uninstall()
        if zmq and not ended:
            kinds[-1].close()
    deadline = time.monotonic() + grace
    findings: list[Finding] = []
    try:
        for kind, snapshot in zip(kinds, before, strict=True):
            items = kind.new_since(snapshot)
            left = kind.settle(items, deadline) if items else []
            findings.extend(kind.findings(left, subject, grace=grace))
    finally:
        if zmq:  # the probe's settings as they were (the guard's), the record's count down
            kinds[-1].close()
    raise_if_any(findings)
