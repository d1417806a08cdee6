"""Call spies: "the timeout that ``X.shutdown(p)`` really passes on" as a timeout policy.

Real process managers compute a budget inside ``shutdown()`` and hand it to a module-level reaper
rather than exposing their policy as a function: checking what reaches the reaper catches a
manager that ignores its policy, which checking the policy function alone never would.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from pytest_shutdown._base.arguments import require_callable

#: Where the spy goes: ``"package.module:function"`` or ``(namespace, "function")``.
SpyTarget = str | tuple[object, str]

_PATCH_LOCK = threading.Lock()


class NotCalledError(AssertionError):
    """The code under test never called the spied function (so its timeout cannot be read)."""


def _resolve(target: SpyTarget) -> tuple[object, str]:
    if isinstance(target, str):
        module_name, sep, attribute = target.partition(":")
        if not sep or not module_name or not attribute:
            raise ValueError(
                f"target: {target!r} is not 'package.module:function'; accepted: that string or "
                "a (namespace, 'function') pair"
            )
        return importlib.import_module(module_name), attribute
    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], str) and target[1]:
        return target[0], target[1]
    raise ValueError(
        f"target: {target!r} is not 'package.module:function' or a (namespace, 'function') pair"
    )


def timeout_passed_to(
    target: SpyTarget,
    call: Callable[[float | None, float | None], object],
    *,
    argument: str = "timeout",
) -> Callable[[float | None, float | None], Any]:
    """A two-argument policy: the ``argument`` that ``call(request, process)`` passes to ``target``.

    ``target`` is the function the code under test looks up at call time, named where it is
    looked up (``"vllm.v1.engine.utils:shutdown"``, not where it is defined). During each
    ``call`` it is replaced by a recorder that binds its arguments against the real function's
    signature (so positional and keyword calls read the same) and returns ``None`` without doing
    anything; it is restored afterwards, also when ``call`` raises. When ``target`` was not called
    at all, the policy raises :class:`NotCalledError` (a wrong cell for
    ``assert_timeout_decoupling``); when it was called more than once, the first value counts.

    ``call`` builds what it needs per cell, e.g. ``lambda request, process:
    make_manager(request).shutdown(process)``.
    """
    namespace, attribute = _resolve(target)
    name = getattr(namespace, "__name__", None) or type(namespace).__qualname__
    where = f"{name}.{attribute}"
    original = getattr(namespace, attribute, None)
    if not callable(original):
        raise ValueError(f"target: {where} is not a function")
    require_callable("timeout_passed_to", "call", call, "a function call(request, process)")
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None
    if signature is not None and argument not in signature.parameters:
        raise ValueError(
            f"argument: {where} has no parameter {argument!r}; "
            f"accepted: {', '.join(signature.parameters)}"
        )

    def policy(request: float | None, process: float | None) -> Any:
        __tracebackhide__ = True  # a NotCalledError points at the test's line
        seen: list[Any] = []

        def recorder(*args: Any, **kwargs: Any) -> None:
            if signature is None:
                seen.append(kwargs.get(argument))
                return
            bound = signature.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            seen.append(bound.arguments.get(argument))

        with _PATCH_LOCK:
            setattr(namespace, attribute, recorder)
            try:
                call(request, process)
            finally:
                setattr(namespace, attribute, original)
        if not seen:
            raise NotCalledError(
                f"the call never reached {where} (request={request!r}, process={process!r}): "
                "name the function where the code under test looks it up at call time, and "
                "check that the call reaches it"
            )
        return seen[0]

    policy.__qualname__ = f"timeout passed to {where}"
    # read by assert_timeout_decoupling to say what its findings checked
    policy.spied_target = where  # type: ignore[attr-defined]
    policy.spied_argument = argument  # type: ignore[attr-defined]
    return policy
