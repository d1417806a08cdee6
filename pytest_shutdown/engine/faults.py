"""ChildFaults: the fault switches of an engine process (no engine imports: every level
imports it from below)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChildFaults:
    """Fault injection for tests of the child's shutdown path; the defaults inject nothing."""

    #: The child sends itself SIGTERM after installing its handlers, before the engine exists.
    signal_before_engine: bool = False
    #: Sleep before building the engine (a slow startup).
    startup_delay_s: float = 0.0
    #: Ranks whose startup raises (a failed start).
    fail_startup_ranks: tuple[int, ...] = ()
    #: How long a rank of ``fail_startup_ranks`` waits before it fails (its peers go ahead: into
    #: the DP group's ``init_process_group``, where they wait for it).
    fail_startup_after_s: float = 0.0
    #: The busy loop ends with ``SystemExit(exit_code)`` instead of 0.
    exit_code: int | None = None
    #: The busy loop ends with ``SystemExit(0)`` as soon as the shutdown is requested, leaving
    #: the state at REQUESTED.
    exit_while_requested: bool = False
    #: A request is added after the busy loop ends: work is left at exit.
    leave_work: bool = False
    #: ``has_work()`` raises once the busy loop has ended.
    has_work_raises: bool = False
    # The production bugs of issue 15, put back for the regressions (each off by default).
    #: False: no death pipe, no parent watch, no PDEATHSIG: the EngineCore outlives its parent
    #: (vLLM issue #55510).
    engine_lifeline: bool = True
    #: True: the lifelines are armed only once start-up is done and the EngineCore waits for its
    #: workers without a deadline (vLLM PR #44751): a start-up interrupted mid-load orphans them.
    lifeline_after_startup: bool = False
    #: True: SIGTERM raises SystemExit in the EngineCore, bypassing the graceful path that stops
    #: its workers (vllm-omni PR #3001).
    sigterm_raises_system_exit: bool = False
    #: False: the workers have no death pipe (they rely on their EngineCore's graceful path).
    worker_lifeline: bool = True
    #: False: the parent never unlinks an EngineCore's output ring, so a SIGKILLed EngineCore's
    #: segment stays in /dev/shm (vLLM #51579).
    parent_unlinks_ring: bool = True
