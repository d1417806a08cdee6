"""Kill anything at any moment: does a whole engine process tree die when part of it does?

``kill_tree_at`` starts the user's engine through a ``TreeLauncher``, waits for ``phase`` and
``level``, delivers ``signal``, then tracks every process of the tree (re-parented ones too)
until all are gone or ``deadline_s`` passed. What is left becomes findings (docs/orphans.md):
``exit-hang`` (the root, or a process stuck in the interpreter's exit, with its stacks),
``orphan-process``, ``collective-hang`` in place of either (:mod:`.collectives`), ``shm-leak``
(a segment no process holds, vLLM #51579) and ``port-leak``. Survivors are killed after they are
reported and what the tree left is removed: nothing outlives the check.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
import re
import signal as signal_module
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from pytest_shutdown._os.killer import kill_trees
from pytest_shutdown._os.phases import (
    WANTED_PHASE_ENV,
    declared_phases,
    phase_pattern,
    reported_phases,
)
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.collectives import (
    collective_hang_finding,
    collective_wait,
    rank_of,
    read_environ,
)
from pytest_shutdown.helpers.report import is_seconds
from pytest_shutdown.helpers.tree import TreeProcess, TreeResources, scan_tree, wait_gone
from pytest_shutdown.helpers.tree_launcher import RunRequest, TreeLauncher
from pytest_shutdown.resources.collateral import signal_name

#: Selector of the root level.
ROOT = "root"
#: Signals the matrix accepts by name.
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT")
#: How long the tree may take to reach the phase (and the level to appear).
PHASE_TIMEOUT_S = 60.0
#: How long the tree has to die after the signal.
DEFAULT_DEADLINE_S = 10.0
#: How long a survivor gets to print its stacks (SIGABRT → faulthandler) before SIGKILL.
STACKS_TIMEOUT_S = 2.0
#: Poll interval while waiting for the phase and for the tree to die.
POLL_S = 0.02
#: A wanted phase close to one the tree reported (a typo) fails once no new phase came for this
#: long; a phase the tree declared it does not know fails at once.
TYPO_QUIET_S = 3.0
#: How alike a wanted phase and a reported one must be to be taken for a typo (difflib ratio).
TYPO_CUTOFF = 0.75
#: How many characters of the tree's output a record keeps.
LOG_TAIL_CHARS = 6000

LevelSelector = Union[str, Callable[[TreeProcess, int], bool]]  # noqa: UP007 - a runtime alias
PhaseSpec = Union[  # noqa: UP007
    str, "re.Pattern[str]", Callable[[str, Sequence[TreeProcess]], bool]
]


@dataclass(frozen=True)
class TreeDeath:
    """What ``kill_tree_at`` saw: the cell, the victim, how long the tree took, what was left."""

    level: str
    signal: str
    phase: str
    root_pid: int
    victim_pid: int
    victim_name: str
    processes_at_signal: int
    root_exitcode: int | None
    duration_s: float
    findings: list[Finding]
    log_tail: str = field(repr=False)

    @property
    def died(self) -> bool:
        """True when every process of the tree was gone by the deadline."""
        return not self.findings


def assert_tree_dies(target: Callable[..., Any] | Sequence[str], **kwargs: Any) -> TreeDeath:
    """``kill_tree_at`` that raises ``ShutdownContractError`` when anything was left."""
    __tracebackhide__ = True  # a failure points at the caller's line
    record = kill_tree_at(target, **kwargs)
    raise_if_any(record.findings)
    return record


def kill_tree_at(
    target: Callable[..., Any] | Sequence[str],
    *,
    level: str = ROOT,
    signal: str | int = "SIGKILL",
    phase: str = "ready",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    levels: Mapping[str, LevelSelector] | None = None,
    phases: Mapping[str, PhaseSpec] | None = None,
    env: Mapping[str, str] | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    phase_timeout_s: float = PHASE_TIMEOUT_S,
    launcher: TreeLauncher | None = None,
) -> TreeDeath:
    """Start ``target``, wait for ``phase``, send ``signal`` to ``level``, watch the tree die.

    ``target``: a picklable callable (a module-level function) called in the root process with
    ``args``/``kwargs``, or a command line (list of strings) executed there. ``levels`` maps level
    names to selectors: ``"root"``, a glob on the process name (``"EngineCore_DP*"``, as ``ps``
    shows it), or ``callable(process, root_pid) -> bool``; ``level`` may also be a selector
    itself. ``phases`` maps phase names to what marks them: a regular expression searched in the
    tree's output, or ``callable(output, processes) -> bool``; by default the line
    ``report_phase(phase)`` writes. The root gets ``PYTEST_SHUTDOWN_PHASE=<phase>``.
    ``launcher``: a started ``TreeLauncher`` to reuse (warm); else one is started and closed.
    """
    if target is None or isinstance(target, (str, bytes)):
        raise TypeError(
            f"kill_tree_at: `target` is {target!r}, expected a picklable function or a command "
            "line as a list of str: ['python', 'serve.py']"
        )
    signum = parse_signal(signal)
    selector = _resolve_level(level, levels)
    marker = _resolve_phase(phase, phases)
    _check_seconds("deadline_s", deadline_s)
    _check_seconds("phase_timeout_s", phase_timeout_s)
    request = _request(target, args, kwargs, env, phase)
    own = launcher is None
    try:
        active = launcher if launcher is not None else TreeLauncher()
    except BaseException:
        _unlink(request.log_path)
        raise
    try:
        with active.lock:
            run = _Run(active, selector, marker, level, signum, phase)
            run.phase_by_line = phase not in (phases or {})
            return run.run(request, deadline_s, phase_timeout_s)
    finally:
        if own:
            active.close()


def parse_signal(value: str | int) -> int:
    """A signal name (``"SIGKILL"``, ``"KILL"``) or number → its number; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return int(signal_module.Signals(value))
    elif isinstance(value, str):
        name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
        found = getattr(signal_module.Signals, name, None)
        if found is not None:
            return int(found)
    accepted = f"{', '.join(SIGNALS)} or any signal name or number"
    raise ValueError(f"signal: unknown signal {value!r}; accepted: {accepted}")


def _check_seconds(option: str, value: object) -> None:
    if not is_seconds(value):
        raise ValueError(f"{option}: expected a finite number of seconds > 0, got {value!r}")


def _resolve_level(level: str, levels: Mapping[str, LevelSelector] | None) -> LevelSelector:
    table: Mapping[str, LevelSelector] = levels if levels is not None else {ROOT: ROOT}
    if level in table:
        return table[level]
    if level == ROOT or any(c in level for c in "*?["):
        return level
    accepted = ", ".join([*table, "root", "a glob on the process name"])
    raise ValueError(f"level: unknown level {level!r}; accepted: {accepted}")


def _resolve_phase(
    phase: str, phases: Mapping[str, PhaseSpec] | None
) -> Callable[[str, Sequence[TreeProcess]], bool]:
    if not isinstance(phase, str) or not phase:
        raise ValueError(f"phase: expected a phase name, got {phase!r}")
    if phases and phase not in phases:
        close = difflib.get_close_matches(phase, list(phases), n=1, cutoff=TYPO_CUTOFF)
        if close:
            raise ValueError(
                f"phase: {phase!r} is not in phases= ({', '.join(phases)}) and looks like a typo "
                f"of {close[0]!r}"
            )
    spec: PhaseSpec = (phases or {}).get(phase, phase_pattern(phase))
    if callable(spec) and not isinstance(spec, re.Pattern):
        return spec
    pattern = re.compile(spec, re.MULTILINE) if isinstance(spec, str) else spec
    return lambda output, processes: pattern.search(output) is not None


def _request(
    target: Callable[..., Any] | Sequence[str],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    phase: str,
) -> RunRequest:
    command = None if callable(target) else list(target)
    if command is not None and (not command or not all(isinstance(a, str) for a in command)):
        raise ValueError(f"target: expected a callable or a non-empty command line, got {target!r}")
    fd, log_path = tempfile.mkstemp(prefix="pytest-shutdown-tree-", suffix=".log")
    os.close(fd)
    full_env = {"PYTHONFAULTHANDLER": "1", **(env or {}), WANTED_PHASE_ENV: phase}
    if command is not None:
        return RunRequest(log_path, full_env, command=command)
    assert callable(target)
    return RunRequest(log_path, full_env, target, tuple(args), dict(kwargs or {}))


@dataclass
class _Run:
    launcher: TreeLauncher
    selector: LevelSelector
    marker: Callable[[str, Sequence[TreeProcess]], bool]
    level: str
    signum: int
    phase: str
    root: int = 0  # the root's pid, and its session's id (it calls setsid)
    log_path: str = ""
    #: Survivors stopped while the stacks of the others are taken.
    _frozen: set[int] = field(default_factory=set)
    #: Every process seen, by (pid, start time), with the parent it had when first seen.
    seen: dict[tuple[int, int], TreeProcess] = field(default_factory=dict)
    #: Whether the phase is marked by ``report_phase``'s line (not a ``phases=`` entry).
    phase_by_line: bool = True
    _reported: list[str] = field(default_factory=list)
    _reported_at: float = field(default_factory=time.monotonic)

    def scan(self) -> dict[int, TreeProcess]:
        members = scan_tree(self.launcher.token, self.launcher.pid, [self.root])
        for proc in members.values():
            self.seen.setdefault(proc.key, proc)
        return members

    def output(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def run(self, request: RunRequest, deadline_s: float, phase_timeout_s: float) -> TreeDeath:
        self.log_path = request.log_path
        resources = TreeResources.before()
        try:
            self.root = self.launcher.run(request)
            victim, at_signal = self._wait_for_phase(phase_timeout_s)
            resources.record(p.pid for p in at_signal.values() if p.alive)
            os.kill(victim.pid, self.signum)
            signalled = time.monotonic()
            left = self._wait_for_death(signalled + deadline_s)
            duration = time.monotonic() - signalled
            # before the survivors are made to dump their stacks (and die): what they still
            # hold is theirs (their orphan finding), not something the tree left
            leftovers = self._resource_findings(resources, left, victim)
            findings = self._findings(left, victim, at_signal, duration) + leftovers
            return TreeDeath(
                self.level,
                signal_name(self.signum),
                self.phase,
                self.root,
                victim.pid,
                victim.name,
                len(at_signal),
                self._root_exitcode(),
                duration,
                findings,
                self.output()[-LOG_TAIL_CHARS:],
            )
        finally:
            self._kill_all()
            resources.clean()
            _unlink(self.log_path)

    def _cell(self, victim: TreeProcess) -> tuple[str, dict[str, Any]]:
        """What was done ("SIGKILL to root (python, pid 12)") and the cell's facts."""
        signame = signal_name(self.signum)
        what = f"{signame} to {self.level} ({victim.name}, pid {victim.pid})"
        cell = {"level": self.level, "signal": signame, "phase": self.phase}
        return what, {**cell, "victim_pid": victim.pid, "victim_name": victim.name}

    def _resource_findings(
        self, resources: TreeResources, left: list[TreeProcess], victim: TreeProcess
    ) -> list[Finding]:
        """``shm-leak`` / ``port-leak`` for what the tree left once its processes were gone."""
        what, cell = self._cell(victim)
        found = resources.left(p.pid for p in left)
        segments, bound = found["segments"], found["ports"] + found["socket_files"]
        ports = {"ports": found["ports"], "socket_files": found["socket_files"]}
        leaks = {
            "shm-leak": (segments, "shared-memory segment(s) of the tree left in /dev/shm after"),
            "port-leak": (bound, "port(s) or socket file(s) of the tree left after"),
        }
        details = {"shm-leak": {"segments": segments}, "port-leak": ports}
        return [
            Finding(
                code,
                f"{len(items)} {text} {what} in phase {self.phase}: "
                + "; ".join(str(r["what"]) for r in items),
                {**cell, **details[code]},
            )
            for code, (items, text) in leaks.items()
            if items
        ]

    def _root_exitcode(self) -> int | None:
        deadline = time.monotonic() + 1.0
        while True:
            code = self.launcher.exitcode(self.root)
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(POLL_S)

    def _wait_for_phase(self, timeout: float) -> tuple[TreeProcess, dict[int, TreeProcess]]:
        deadline = time.monotonic() + timeout
        while True:
            output = self.output()  # first: what announced the phase existed before the scan
            members = self.scan()
            alive = [p for p in members.values() if p.alive]
            if self.marker(output, alive):
                victim = self._choose(alive)
                if victim is not None:
                    return victim, members
            self._fail_on_unknown_phase(output)
            if self.launcher.exitcode(self.root) is not None:
                raise RuntimeError(
                    f"the tree's root exited (code {self.launcher.exitcode(self.root)}) before "
                    f"phase {self.phase!r} with level {self.level!r} was reached; its output:\n"
                    + self.output()[-LOG_TAIL_CHARS:]
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"phase {self.phase!r} with a process of level {self.level!r} not reached "
                    f"within phase_timeout_s={timeout:g} s; processes: "
                    f"{sorted((p.pid, p.name) for p in alive)}; output:\n"
                    + self.output()[-LOG_TAIL_CHARS:]
                )
            time.sleep(POLL_S)

    def _fail_on_unknown_phase(self, output: str) -> None:
        """A phase the tree will never report fails now, naming the phases it knows: at once
        when the tree declared its phases (``wanted_phase(known=...)``), else when the tree
        reported a phase much like it (a typo) and nothing new for ``TYPO_QUIET_S``."""
        if not self.phase_by_line:
            return
        reported = reported_phases(output)
        if reported != self._reported:
            self._reported, self._reported_at = reported, time.monotonic()
        if self.phase in reported:
            return
        seen = f"; reported so far: {', '.join(reported) or 'none'}"
        declared = declared_phases(output)
        if declared is not None and self.phase not in declared:
            raise ValueError(
                f"phase: the tree never reaches phase {self.phase!r}; the phases it knows: "
                f"{', '.join(declared)}{seen}"
            )
        close = difflib.get_close_matches(self.phase, reported, n=1, cutoff=TYPO_CUTOFF)
        if close and time.monotonic() - self._reported_at >= TYPO_QUIET_S:
            raise ValueError(
                f"phase: the tree never reported phase {self.phase!r} (did you mean "
                f"{close[0]!r}?){seen}; the phases known are those the tree reports with "
                "report_phase() (or declares with wanted_phase(known=...))"
            )

    def _choose(self, alive: list[TreeProcess]) -> TreeProcess | None:
        selector = self.selector
        if selector == ROOT:
            matches = [p for p in alive if p.pid == self.root]
        elif isinstance(selector, str):
            matches = [p for p in alive if fnmatch.fnmatchcase(p.name, selector)]
        else:
            matches = [p for p in alive if selector(p, self.root)]
        return min(matches, key=lambda p: (p.name, p.start_ticks, p.pid), default=None)

    def _wait_for_death(self, deadline: float) -> list[TreeProcess]:
        while True:
            left = [p for p in self.scan().values() if p.alive]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(POLL_S)

    def _findings(
        self,
        left: list[TreeProcess],
        victim: TreeProcess,
        at_signal: dict[int, TreeProcess],
        duration: float,
    ) -> list[Finding]:
        what, cell = self._cell(victim)
        cell["waited_s"] = round(duration, 3)
        after = f"{duration:.1f} s after {what} in phase {self.phase}"
        findings = []
        # Every survivor, the root too, is frozen (SIGSTOP) while the stacks are taken: one's
        # death must not change where another is stuck (a rank whose store server was the root,
        # a root whose join() returns once the rank it joins is gone). Stacks are taken from the
        # deepest process up, the root last: a rank that dies with its parent (PR_SET_PDEATHSIG,
        # which even a stopped process obeys) still shows the collective it is blocked in.
        self._frozen = {p.pid for p in left if _signal(p.pid, "SIGSTOP")}
        ordered = sorted(left, key=lambda p: (p.pid != self.root, p.pid))
        facts_of: dict[int, dict[str, Any]] = {}
        environs: dict[int, dict[str, str] | None] = {}
        for proc in ordered:  # what /proc says, while every survivor is still there
            first = self.seen.get(proc.key, proc)
            facts_of[proc.pid] = {
                **cell,
                "pid": proc.pid,
                "name": proc.name,
                "cmdline": proc.cmdline(),
                "parent_at_end": proc.ppid,
                "parent_at_signal": at_signal[proc.pid].ppid if proc.pid in at_signal else None,
                "parent_when_first_seen": first.ppid,
                "age_s": None if (age := proc.age_s()) is None else round(age, 3),
                "device_memory_bytes": device_memory_of(proc.pid),
            }
            environs[proc.pid] = read_environ(proc.pid)
        stacks_of = {proc.pid: self._stacks(proc) for proc in _descendants_first(left)}
        for proc in ordered:
            facts = facts_of[proc.pid]
            facts["stacks"] = stacks = stacks_of[proc.pid]
            blocked = blocked_in(stacks)
            wait = collective_wait(stacks)
            rank = rank_of(environs[proc.pid], proc.name)
            who = f"{proc.name} (pid {proc.pid}, parent now {proc.ppid})"
            if wait is not None:  # a rank waiting for a peer: say which collective
                finding = collective_hang_finding(
                    wait, name=proc.name, pid=proc.pid, rank=rank, after=after, facts=facts
                )
            elif proc.pid == self.root:
                text = f"the root {proc.name} (pid {proc.pid}) did not exit within {after}"
                text += f"; blocked in {blocked}" if blocked else ""
                finding = Finding("exit-hang", text, {**facts, "blocked_in": blocked})
            elif in_interpreter_exit(stacks):
                text = f"{who} is stuck exiting {after}; blocked in {blocked}"
                finding = Finding("exit-hang", text, {**facts, "blocked_in": blocked})
            else:
                text = f"{who} outlived {what} in phase {self.phase} by {duration:.1f} s"
                finding = Finding("orphan-process", text, facts)
            findings.append(finding)
        return findings

    def _stacks(self, proc: TreeProcess) -> str:
        """SIGABRT a survivor: faulthandler prints every thread's stack into the tree's log."""
        before = len(self.output())
        try:
            os.kill(proc.pid, signal_module.SIGABRT)
        except OSError:
            return ""
        if proc.pid in self._frozen:  # SIGABRT is handled first, where it was stopped
            _signal(proc.pid, "SIGCONT")
        wait_gone([proc.pid], STACKS_TIMEOUT_S)
        text = self.output()[before:]
        return text if "most recent call first" in text else ""

    def _kill_all(self) -> None:
        for _ in range(3):
            members = [p for p in self.scan().values() if p.alive] if self.launcher.alive else []
            if not members:
                return
            kill_trees(
                [p.pid for p in members], why="the tree check ends the tree it ran", timeout=0.0
            )
            wait_gone([p.pid for p in members], 5.0)


def _descendants_first(processes: Sequence[TreeProcess]) -> list[TreeProcess]:
    """``processes`` ordered so that each comes after every one of its descendants among them."""
    parent = {p.pid: p.ppid for p in processes}

    def depth(pid: int) -> int:
        seen = {pid}
        found = 0
        while parent.get(pid) in parent and parent[pid] not in seen:
            pid = parent[pid]
            seen.add(pid)
            found += 1
        return found

    return sorted(processes, key=lambda p: (-depth(p.pid), p.pid))


#: The frames of the interpreter's exit sequence, and what a process stuck in one waits for.
_EXIT_FRAMES = {
    re.compile(r"threading\.py\", line \d+ in _shutdown"): (
        "interpreter exit joining a non-daemon thread (threading._shutdown)"
    ),
    re.compile(r"multiprocessing/util\.py\", line \d+ in _exit_function"): (
        "multiprocessing's exit joining a child process"
    ),
}


def in_interpreter_exit(stacks: str) -> bool:
    """Whether a faulthandler dump shows the process in the interpreter's exit sequence."""
    return any(p.search(stacks) for p in _EXIT_FRAMES)


def blocked_in(stacks: str) -> str:
    """A short reading of a faulthandler dump: what the process waits for at exit."""
    if not stacks:
        return ""
    reasons = [why for pattern, why in _EXIT_FRAMES.items() if pattern.search(stacks)]
    if re.search(r" in join\b", stacks) and not reasons:
        reasons.append("a join() of a thread or process")
    tops = [m.group(1) for m in re.finditer(r"most recent call first\):\n\s+File (.+)", stacks)]
    if tops:
        reasons.append("top frames: " + " | ".join(t.strip() for t in tops[:4]))
    return "; ".join(reasons)


def _signal(pid: int, name: str) -> bool:
    try:
        os.kill(pid, getattr(signal_module, name))
    except OSError:
        return False
    return True


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def device_memory_of(pid: int) -> int | None:
    """Device memory ``pid`` holds (NVML's per-process figure); None when no reader exists."""
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no pynvml, or no driver: no reader
        return None
    try:
        total = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for info in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if info.pid == pid:
                    total += int(info.usedGpuMemory or 0)
        return total
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
