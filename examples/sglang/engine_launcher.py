"""SGLang's launch path as a command line, for the orphan matrix (``test_sglang_orphans.py``).

    python engine_launcher.py

Builds SGLang's ``Engine`` on fake workers (``sglang_engines.make_engine``), says ``ready`` with
``report_phase`` and serves until it is killed, as a process holding an ``sgl.Engine`` does.
The tree: this process (root), ``sglang::scheduler`` and ``sglang::detokenizer`` (spawned by
SGLang, each armed with SGLang's ``kill_itself_when_parent_died``) and multiprocessing's
resource tracker.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

#: the titles SGLang's workers (here the fakes) take once their lifeline is armed
ARMED = ("sglang::schedul", "sglang::detoken")
ARM_DEADLINE_S = 300.0


def _children_titles() -> set[str]:
    titles = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                    titles.add(f.read().strip())
            except OSError:
                pass
    return titles


def wait_until_armed() -> None:
    """``Engine.__init__`` returns once the scheduler said it is ready; the detokenizer has no
    such handshake and arms ``kill_itself_when_parent_died`` only after its imports. A SIGKILL
    to this process before that orphans it (a race of SGLang's launch, seen under load): the
    check is of the armed lifelines, so ready waits for both workers' titles."""
    deadline = time.monotonic() + ARM_DEADLINE_S
    while not all(title in _children_titles() for title in ARMED):
        if time.monotonic() > deadline:
            raise TimeoutError(f"SGLang's workers did not arm within {ARM_DEADLINE_S:g} s")
        time.sleep(0.05)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from sglang_engines import make_engine

    from pytest_shutdown.orphans import report_phase

    engine = make_engine()
    wait_until_armed()
    report_phase("ready")
    while engine is not None:
        time.sleep(3600)


if __name__ == "__main__":
    main()
