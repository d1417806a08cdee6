"""Findings: the data every check produces and every report renders."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.text import key_fact_lines

#: The stable finding codes users can match on, with what each one means.
FINDING_CODES: Mapping[str, str] = {
    "shutdown-raised": "a shutdown call raised instead of returning",
    "cleanup-repeated": "a cleanup ran again on a later shutdown or on garbage collection",
    "cleanup-missing": "a cleanup that explicit shutdown performs did not run on collection",
    "finalizer-bound-method": "a weakref.finalize callback is a bound method of its own object",
    "finalizer-holds-object": "a weakref.finalize callback or its arguments reach the object",
    "not-collected": "the object stayed alive after its last reference was dropped",
    "blocking-close": "shutdown blocked on running work instead of returning",
    "loop-blocked": "a coroutine shutdown (aclose) blocked its event loop for longer than its "
    "budget: a synchronous sleep, join or socket call inside async code",
    "thread-leak": "a thread started inside the check is still running",
    "process-leak": "a child process started inside the check is still running",
    "gc-frozen-leak": "gc.get_freeze_count() changed: a gc.freeze() was left behind",
    "force-killed": "a process had to be force-killed at the end of its shutdown budget",
    "timeout-policy": "a process shutdown timeout policy returned the wrong budget",
    "device-memory-held": "device memory did not return to its baseline after shutdown",
    "shutdown-budget": "a teardown ran past its shutdown budget and was interrupted",
    "gc-freeze-policy": "a process froze its heap at exit where the policy forbids it, or did not "
    "where it requires it",
    "orphan-process": "a process of a tree outlived the death of part of the tree (an orphan)",
    "exit-hang": "a process did not exit: its exit blocked (a non-daemon thread, an untimed join)",
    "growth": "objects, threads, fds or memory grew over repeated build/use/shutdown cycles",
    "collective-hang": "a process of a killed tree is blocked in a collective or a store wait "
    "(all_reduce, barrier, broadcast, TCPStore get/wait) for a peer that is gone",
    "process-group-left": "a torch.distributed process group (the default one or one a test "
    "created) is still initialised after the test or the engine's shutdown",
    "ray-resource-left": "an engine on Ray left an actor alive, a placement group not removed, "
    "cluster resources not back to their baseline, or a ray:: worker process after its shutdown",
    "fd-leak": "a file descriptor opened inside the check is still open",
    "port-leak": "a listening port or a bound unix socket (or its socket file) is still held",
    "shm-leak": "a shared-memory segment (/dev/shm) created inside the check is still present",
    "global-state": "process-wide state (gc, a signal handler, the start method, an excepthook, "
    "os.environ) was changed and not put back",
    "atexit-holds-object": "an atexit callback registered during the test holds an object the "
    "test created until the interpreter exits",
    "collateral-kill": "a process the test did not start (a wider-scope fixture's, one alive "
    "before it) died by a signal during the test",
    "task-leak": "an asyncio task created during the test was still pending at its end, or when "
    "its loop's runner shut down and cancelled it",
    "loop-left": "an asyncio event loop created during the test was never closed",
    "asyncgen-left": "an async generator first iterated during the test was never finalized: its "
    "loop closed before its aclose() ran",
    "coroutine-never-awaited": "a coroutine created during the test was never awaited (CPython's "
    "RuntimeWarning, as a finding)",
    "zmq-term-blocked": "a zmq Context.term() did not return within the grace: a socket of its "
    "context was still open, or closed with a linger other than 0 and unsent messages",
    "shutdown-logged-error": "a graceful shutdown logged an ERROR record or wrote a traceback "
    "(in the process, or in a child process's stderr) though it succeeded",
}


@lazy_dataclass(frozen=True)
class Finding:
    """One broken shutdown contract.

    ``code`` is one of :data:`FINDING_CODES`; ``message`` is one sentence naming the object and
    what is wrong; ``details`` holds JSON-serialisable facts (durations, counts, stacks, pids).
    """

    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.code not in FINDING_CODES:
            accepted = ", ".join(FINDING_CODES)
            raise ValueError(f"unknown finding code {self.code!r}; accepted: {accepted}")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": dict(self.details)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(data["code"], data["message"], dict(data.get("details", {})))


class ShutdownContractError(AssertionError):
    """Raised by every helper when a shutdown contract is broken; carries the findings."""

    def __init__(self, findings: Iterable[Finding]) -> None:
        self.findings: list[Finding] = list(findings)
        if not self.findings:
            raise ValueError("ShutdownContractError needs at least one finding")
        super().__init__(str(self))

    def __str__(self) -> str:
        lines: list[str] = []
        for finding in self.findings:
            lines.append(f"[{finding.code}] {finding.message}")
            lines.extend(key_fact_lines(finding.code, finding.details))
        return "\n".join(lines)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]


def raise_if_any(findings: Iterable[Finding]) -> None:
    """Raise :class:`ShutdownContractError` when ``findings`` is not empty."""
    __tracebackhide__ = True  # a failure points at the caller's line
    found = list(findings)
    if found:
        raise ShutdownContractError(found)
