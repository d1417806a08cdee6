"""``no_global_state_changes``: a block must leave process-wide state as it found it.

The same check as the guard's ``global-state`` kind (:mod:`pytest_shutdown.resources.global_state`)
around one block of code: gc enabled and thresholds, every catchable signal's handler, a forced
``multiprocessing`` start method, ``sys.excepthook`` / ``threading.excepthook``, ``os.environ``.
"""

from __future__ import annotations

from collections.abc import Iterator

from pytest_shutdown._base.hidden import contextmanager  # no contextlib frame on failure
from pytest_shutdown.findings.finding import ShutdownContractError

__all__ = ["no_global_state_changes"]


@contextmanager
def no_global_state_changes(*, restore: bool = True) -> Iterator[None]:
    """Fail with ``global-state`` when the block changes process-wide state and leaves it so.

    ``restore=True`` (the default) puts back what can be put back before raising (gc, handlers,
    hooks, the start method, the environment), so the next test starts clean. When the block
    raises, its exception propagates unchanged and nothing is checked.

    Example::

        with no_global_state_changes():
            load_model(path)   # must not leave gc disabled
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    from pytest_shutdown.resources.global_state import GlobalStateKind  # noqa: PLC0415

    kind = GlobalStateKind()
    before = kind.snapshot()
    yield
    changes = kind.diff(before, kind.snapshot())
    if changes:
        if restore:
            kind.restore(changes)
        raise ShutdownContractError(kind.findings(changes, "the block", grace=0.0))
