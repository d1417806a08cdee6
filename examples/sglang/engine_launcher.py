"""SGLang's launch path as a command line, for the orphan matrix (``test_sglang_orphans.py``).

    python engine_launcher.py

Builds a ``FakeEngine`` (SGLang's ``Engine.__init__`` on fake workers), says ``ready`` with
``report_phase`` and serves until it is killed, as a process holding an ``sgl.Engine`` does.
The tree: this process (root), ``sglang::scheduler`` and ``sglang::detokenizer`` (spawned by
SGLang, each armed with SGLang's ``kill_itself_when_parent_died``) and multiprocessing's
resource tracker.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from sglang_engines import make_engine

    from pytest_shutdown import report_phase

    engine = make_engine()
    report_phase("ready")
    while engine is not None:
        time.sleep(3600)


if __name__ == "__main__":
    main()
