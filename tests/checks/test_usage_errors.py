"""Every public helper refuses a wrong argument at once, before any shutdown runs, with a
``TypeError`` (``ValueError`` for a value out of range) naming the helper, the argument and the
fix: a class where an instance is expected, ``None``, something not callable where a function is,
a context-manager helper used without calling it. Valid input still works."""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import pytest_shutdown
from pytest_shutdown import (
    ShutdownContractError,
    assert_device_memory_released,
    assert_finalizers_ok,
    assert_finalizes_on_gc,
    assert_freeze_policy,
    assert_idempotent_shutdown,
    assert_no_collateral,
    assert_no_growth,
    assert_nonblocking_shutdown,
    assert_not_force_killed,
    assert_second_engine_clean,
    assert_timeout_decoupling,
    kill_tree_at,
    probe_exit,
    timeout_passed_to,
)
from pytest_shutdown.aio import (
    assert_finalizes_on_gc_async,
    assert_idempotent_shutdown_async,
    assert_nonblocking_shutdown_async,
)


class Engine:
    """Counts every shutdown of any engine, called on an instance or (wrongly) on the class."""

    shutdowns = 0

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)

    def shutdown(self: Engine | None = None) -> None:
        Engine.shutdowns += 1
        if self is not None:
            self.pool.shutdown(wait=False)

    async def aclose(self: Engine | None = None) -> None:
        self.shutdown() if self is not None else Engine.shutdown()

    def used_bytes(self: Engine | None = None) -> int:
        Engine.shutdowns += 1  # a reading counts as running the helper too
        return 0


@pytest.fixture(autouse=True)
def _no_shutdown_ran() -> Any:
    """A usage error is raised before anything of the helper runs."""
    Engine.shutdowns = 0
    yield
    assert Engine.shutdowns == 0


def _call(helper: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = helper(*args, **kwargs)
    return asyncio.run(result) if asyncio.iscoroutine(result) else result


#: (helper, its arguments with ``SUBJECT`` where the instance goes, the argument's name)
SUBJECT = object()
INSTANCE_EXPECTED = [
    (assert_idempotent_shutdown, (SUBJECT,), "obj"),
    (assert_nonblocking_shutdown, (SUBJECT,), "obj"),
    (assert_finalizers_ok, (SUBJECT,), "obj"),
    (assert_idempotent_shutdown_async, (SUBJECT,), "obj"),
    (assert_nonblocking_shutdown_async, (SUBJECT,), "obj"),
    (assert_not_force_killed, (SUBJECT,), "outcome"),
    (assert_device_memory_released, (SUBJECT, 0), "reader"),
]


def _with(args: tuple[Any, ...], value: object) -> tuple[Any, ...]:
    return tuple(value if arg is SUBJECT else arg for arg in args)


@pytest.mark.parametrize(("helper", "args", "argument"), INSTANCE_EXPECTED)
def test_a_class_where_an_instance_is_expected(
    helper: Callable[..., Any], args: tuple[Any, ...], argument: str
) -> None:
    expected = (
        f"{helper.__name__}: `{argument}` is the class Engine, expected an instance: "
        "pass Engine(...)"
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        _call(helper, *_with(args, Engine))


@pytest.mark.parametrize(("helper", "args", "argument"), INSTANCE_EXPECTED)
def test_none_where_an_instance_is_expected(
    helper: Callable[..., Any], args: tuple[Any, ...], argument: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(f"{helper.__name__}: `{argument}` is None")):
        _call(helper, *_with(args, None))


@pytest.mark.parametrize("helper", [assert_idempotent_shutdown, assert_nonblocking_shutdown_async])
def test_a_method_the_object_lacks_is_named(helper: Callable[..., Any]) -> None:
    words = f"{helper.__name__}: `obj` (Engine) has no callable 'stop'"
    with pytest.raises(ValueError, match=re.escape(words)):
        _call(helper, Engine(), "stop")
    with pytest.raises(TypeError, match=re.escape("`method` must be the name of a method")):
        _call(helper, Engine(), None)


def test_an_instance_with_its_method_is_checked_as_before() -> None:
    assert_nonblocking_shutdown(Engine(), budget=2.0)
    assert_idempotent_shutdown(Engine())
    assert_finalizers_ok(Engine())
    assert Engine.shutdowns >= 1 + 3
    Engine.shutdowns = 0


def _spied(timeout: float | None = None) -> None:
    return None


#: (helper, its arguments with ``SUBJECT`` where the callable goes, the argument's name)
CALLABLE_EXPECTED = [
    (assert_finalizes_on_gc, (SUBJECT,), {}, "factory"),
    (assert_finalizes_on_gc_async, (SUBJECT,), {}, "factory"),
    (assert_no_collateral, (SUBJECT,), {}, "fn"),
    (assert_no_growth, (SUBJECT,), {}, "cycle"),
    (assert_second_engine_clean, (SUBJECT, print), {}, "build"),
    (assert_second_engine_clean, (Engine, SUBJECT), {}, "use"),
    (assert_second_engine_clean, (Engine, print), {"shutdown": SUBJECT}, "shutdown"),
    (probe_exit, (SUBJECT,), {}, "target"),
    (assert_freeze_policy, (SUBJECT,), {}, "target"),
    (assert_timeout_decoupling, (SUBJECT,), {"grace": 1.0}, "policy"),
    (timeout_passed_to, ((sys.modules[__name__], "_spied"), SUBJECT), {}, "call"),
]


@pytest.mark.parametrize(("helper", "args", "kwargs", "argument"), CALLABLE_EXPECTED)
def test_an_instance_where_a_function_is_expected(
    helper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], argument: str
) -> None:
    instance = Engine()
    kwargs = {name: instance if v is SUBJECT else v for name, v in kwargs.items()}
    words = f"{helper.__name__}: `{argument}` is an instance of Engine, not callable; expected "
    with pytest.raises(TypeError, match=re.escape(words)):
        _call(helper, *_with(args, instance), **kwargs)


@pytest.mark.parametrize(("helper", "args", "kwargs", "argument"), CALLABLE_EXPECTED)
def test_none_where_a_function_is_expected(
    helper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], argument: str
) -> None:
    kwargs = {name: None if v is SUBJECT else v for name, v in kwargs.items()}
    with pytest.raises(TypeError, match=re.escape(f"{helper.__name__}: `{argument}` is None")):
        _call(helper, *_with(args, None), **kwargs)


def test_a_factory_given_as_a_class_or_a_function_is_checked_as_before() -> None:
    class Plain:
        pass

    assert_finalizes_on_gc(Plain)
    assert_finalizes_on_gc(lambda: Plain())
    assert assert_no_collateral(lambda: 7) == 7


def test_kill_tree_at_without_a_target_says_what_it_takes() -> None:
    with pytest.raises(TypeError, match=re.escape("kill_tree_at: `target` is None, expected a")):
        kill_tree_at(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a command line as a list of str"):
        kill_tree_at("python serve.py")


@pytest.mark.parametrize("helper", [assert_nonblocking_shutdown, assert_nonblocking_shutdown_async])
@pytest.mark.parametrize(
    ("budget", "error", "words"),
    [
        (None, TypeError, "`budget` must be a number of seconds, got None"),
        ("1", TypeError, "`budget` must be a number of seconds, got '1'"),
        (-1, ValueError, "`budget` must be seconds > 0, got -1"),
        (float("nan"), ValueError, "`budget` must be seconds > 0, got nan"),
    ],
)
def test_a_budget_that_is_not_seconds_is_named(
    helper: Callable[..., Any], budget: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(f"{helper.__name__}: {words}")):
        _call(helper, Engine(), budget=budget)


# ---- context-manager helpers used without calling them --------------------------------------

CONTEXT_MANAGERS = ["no_leaks", "no_global_state_changes", "no_logged_errors", "no_os_leaks"]
BOTH_WAYS = "no_task_leaks"  # with and async with


@pytest.mark.parametrize("name", [*CONTEXT_MANAGERS, BOTH_WAYS])
def test_with_a_helper_not_called_says_to_call_it(name: str) -> None:
    helper = getattr(pytest_shutdown, name)
    with pytest.raises(TypeError, match=re.escape(f"{name} is a function: write `with {name}():`")):
        with helper:
            pass
    with helper():  # called, it is the context manager it always was
        pass


@pytest.mark.parametrize("name", CONTEXT_MANAGERS)
def test_async_with_a_sync_helper_says_to_use_with(name: str) -> None:
    helper = getattr(pytest_shutdown, name)

    async def uncalled() -> None:
        async with helper:
            pass

    async def called() -> None:
        async with helper():
            pass

    words = f"{name} is a function, and a sync context manager: write `with {name}():`"
    with pytest.raises(TypeError, match=re.escape(words)):
        asyncio.run(uncalled())
    words = f"{name}() is a sync context manager: write `with {name}():`"
    with pytest.raises(TypeError, match=re.escape(words)):
        asyncio.run(called())


def test_async_with_no_task_leaks_not_called_says_to_call_it() -> None:
    async def uncalled() -> None:
        async with pytest_shutdown.no_task_leaks:  # type: ignore[attr-defined]
            pass

    async def called() -> None:
        async with pytest_shutdown.no_task_leaks():
            pass

    words = "no_task_leaks is a function: write `async with no_task_leaks():`"
    with pytest.raises(TypeError, match=re.escape(words)):
        asyncio.run(uncalled())
    asyncio.run(called())


@pytest.mark.parametrize("name", CONTEXT_MANAGERS)
def test_a_context_manager_helper_keeps_its_name_signature_and_docstring(name: str) -> None:
    helper = getattr(pytest_shutdown, name)
    assert helper.__name__ == name
    assert helper.__doc__ == helper.__wrapped__.__doc__ and helper.__doc__
    assert inspect.signature(helper) == inspect.signature(helper.__wrapped__)


def test_a_contract_failure_is_still_a_shutdown_contract_error() -> None:
    """The validation changes nothing of what a wrong engine gets: findings."""

    class RaisesTwice:
        def __init__(self) -> None:
            self.calls = 0

        def shutdown(self) -> None:
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("closed twice")

    with pytest.raises(ShutdownContractError) as caught:
        assert_idempotent_shutdown(RaisesTwice())
    assert "shutdown-raised" in caught.value.codes
