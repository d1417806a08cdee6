"""SGLang's ``Engine`` on fake workers, and the scoped kill its shutdown should have been.

``make_engine`` builds an instance of ``sglang.srt.entrypoints.engine.Engine`` itself (not a
subclass: a finding names SGLang's class) with only its three override points replaced on the
instance (``run_scheduler_process_func``, ``run_detokenizer_process_func``,
``init_tokenizer_manager_func``, see ``fake_workers``): ``Engine.__init__`` and
``_launch_subprocesses`` (``_set_envs_and_config``: the SIGQUIT handler and
``mp.set_start_method("spawn", force=True)``; the spawned scheduler and detokenizer, the
scheduler's ready handshake, the ``SubprocessWatchdog``, the ZMQ RPC socket, the
``atexit.register(self.shutdown)``) and ``Engine.shutdown`` are SGLang 0.5.23's own code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fake_workers
from sglang.srt.entrypoints import engine as engine_module
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.utils import kill_process_tree

TINY_MODEL = str(Path(__file__).with_name("tiny_model"))
#: ``SGLANG_CHECK_MUTANT=kill-everything``: the scoped kill delegates to SGLang's own blanket
#: kill again; ``scripts/sglang-check`` runs the scoped check so and expects it to fail.
MUTANT_ENV = "SGLANG_CHECK_MUTANT"


#: The override points ``Engine`` offers for its private forks (class attributes it reads as
#: ``self.<name>``), each set to a stand-in that needs no model.
FAKES: dict[str, Callable[..., Any]] = {
    "run_scheduler_process_func": fake_workers.fake_scheduler,
    "run_detokenizer_process_func": fake_workers.fake_detokenizer,
    "init_tokenizer_manager_func": fake_workers.fake_tokenizer_manager,
}


def make_engine() -> Engine:
    """SGLang's Engine on the tiny model, on CPU, on fake workers, SGLang's defaults otherwise.

    The object is an ``Engine`` (``type(engine) is Engine``): the stand-ins are set on the
    instance before SGLang's own ``Engine.__init__`` runs on it, so what holds the engine
    (``atexit.register(self.shutdown)``) holds SGLang's class, and a finding says so.
    """
    engine = Engine.__new__(Engine)
    vars(engine).update(FAKES)  # instance attributes win over the class's staticmethods
    engine.__init__(
        model_path=TINY_MODEL, device="cpu", skip_tokenizer_init=True, load_format="dummy"
    )
    return engine


def kill_own_children(engine: Engine) -> Callable[..., None]:
    """``kill_process_tree`` scoped to the trees of ``engine.get_all_child_pids()``.

    A stand-in for ``sglang.srt.utils.kill_process_tree`` while ``Engine.shutdown`` runs: its
    final ``kill_process_tree(os.getpid(), include_parent=False)`` kills each of the engine's
    own children (and their descendants) with SGLang's ``kill_process_tree`` instead of every
    child of the process. Any other call goes to SGLang's function unchanged.
    """
    owned = list(engine.get_all_child_pids())

    def scoped(parent_pid: Any = None, include_parent: bool = True, **kwargs: Any) -> None:
        blanket = parent_pid == os.getpid() and not include_parent
        if not blanket or os.environ.get(MUTANT_ENV) == "kill-everything":
            kill_process_tree(parent_pid, include_parent=include_parent, **kwargs)
            return
        for pid in owned:
            kill_process_tree(pid, include_parent=True, **kwargs)

    return scoped


@contextmanager
def scoped_shutdown(engine: Engine) -> Iterator[None]:
    """While inside, ``Engine.shutdown`` kills only ``engine``'s own children."""
    original = engine_module.kill_process_tree
    engine_module.kill_process_tree = kill_own_children(engine)
    try:
        yield
    finally:
        engine_module.kill_process_tree = original


def shutdown_scoped(engine: Engine) -> None:
    """SGLang's ``Engine.shutdown`` with the scoped kill of ``scoped_shutdown``."""
    with scoped_shutdown(engine):
        engine.shutdown()
