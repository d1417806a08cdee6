"""``collective-hang``: a process blocked in a collective or a store wait, read from its stacks.

A rank whose peer died waits in ``all_reduce``, ``barrier`` or a ``TCPStore`` ``get``/``wait``
forever (vLLM #32136, SGLang #34233), its signal handlers never running (the main thread is in
C++). A faulthandler thread whose innermost frames are in ``torch.distributed`` and name a
collective, or whose innermost frame's source line calls one, is blocked in it. No torch: the
dump is text, the rank is read from the process's environment or its name.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_shutdown.findings.finding import Finding

#: Functions of ``torch.distributed`` that block until every rank (or the store) answers.
COLLECTIVES = frozenset(
    (
        "all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all "
        "all_to_all_single barrier monitored_barrier broadcast broadcast_object_list gather "
        "gather_object scatter scatter_object_list reduce reduce_scatter reduce_scatter_tensor "
        "send recv batch_isend_irecv destroy_process_group init_process_group new_group "
        "_store_based_barrier rendezvous _create_c10d_store _abort_process_group"
    ).split()
)
#: A source line that calls into the store or a collective (the frame that entered C++).
_CALL_LINE = re.compile(
    r"\b(?P<store>\w*store\w*)\s*\.\s*(?P<store_op>get|wait|compare_set|add|check|multi_get)\s*\("
    r"|\b(?:dist|distributed|torch\.distributed)\s*\.\s*(?P<op>\w+)\s*\("
    r"|\.\s*(?P<work>wait)\s*\(\s*(?:timeout\s*=.*)?\)\s*$"
)
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')
_RANK_NAME = re.compile(r"(?:TP|DP|PP|rank|RANK|Rank)[_-]?(\d+)$")


@dataclass(frozen=True)
class CollectiveWait:
    """One thread found blocked in a collective or a store wait."""

    operation: str
    #: The frame that names it, as faulthandler printed it.
    frame: str
    #: That thread's header and frames.
    stack: str


def collective_wait(stacks: str) -> CollectiveWait | None:
    """The first thread of a faulthandler dump blocked in a collective or store wait, if any."""
    for header, frames in _threads(stacks):
        found = _blocking_operation(frames)
        if found is not None:
            operation, frame = found
            return CollectiveWait(operation, frame, "\n".join([header, *frames]))
    return None


def _threads(stacks: str) -> list[tuple[str, list[str]]]:
    threads: list[tuple[str, list[str]]] = []
    for line in stacks.splitlines():
        if _THREAD.match(line):
            threads.append((line, []))
        elif threads and _FRAME.match(line):
            threads[-1][1].append(line)
    return threads


def _blocking_operation(frames: list[str]) -> tuple[str, str] | None:
    """From the innermost frame out: torch.distributed frames name the collective; the first
    frame outside torch.distributed is read at its source line."""
    for text in frames:
        frame = _FRAME.match(text)
        if frame is None:
            continue
        path, func = frame["file"], frame["func"]
        if "/torch/distributed/" in path.replace("\\", "/"):
            if func in COLLECTIVES:
                return func, text.strip()
            continue
        source = linecache.getline(path, int(frame["line"])).strip()
        call = _CALL_LINE.search(source)
        if call is None:
            return None
        if call["store_op"]:
            return f"store.{call['store_op']}", text.strip()
        if call["op"] and call["op"] in COLLECTIVES:
            return call["op"], text.strip()
        if call["work"]:
            return "work.wait", text.strip()
        return None
    return None


def rank_of(environ: Mapping[str, str] | None, name: str) -> int | None:
    """A process's rank: ``RANK`` in its environment (torchrun, mp.spawn launchers), else the
    number its name ends with (``Worker_TP1``, ``EngineCore_DP0``, ``rank3``); None if neither."""
    if environ:
        value = environ.get("RANK", "")
        if value.isdigit():
            return int(value)
    match = _RANK_NAME.search(name)
    return int(match.group(1)) if match else None


def read_environ(pid: int) -> dict[str, str] | None:
    """The process's initial environment (``/proc/<pid>/environ``); None if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def collective_hang_finding(
    wait: CollectiveWait,
    *,
    name: str,
    pid: int,
    rank: int | None,
    after: str,
    facts: Mapping[str, Any],
) -> Finding:
    """The ``collective-hang`` finding for a process of a killed tree blocked in ``wait``."""
    who = f"{name} (pid {pid}" + (f", rank {rank})" if rank is not None else ")")
    return Finding(
        "collective-hang",
        f"{who} is blocked in {wait.operation} {after}",
        {
            **facts,
            "rank": rank,
            "operation": wait.operation,
            "frame": wait.frame,
            "collective_stack": wait.stack,
        },
    )
