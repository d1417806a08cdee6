"""checks.hidden.contextmanager keeps contextlib's semantics (only the traceback differs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_shutdown._base.hidden import contextmanager


def test_the_value_is_yielded_and_the_code_after_the_yield_runs_on_exit() -> None:
    events: list[str] = []

    @contextmanager
    def block(name: str) -> Iterator[str]:
        events.append("enter")
        yield name
        events.append("exit")

    with block("x") as value:
        assert value == "x"
        events.append("body")

    assert events == ["enter", "body", "exit"]


def test_an_exception_of_the_block_propagates_unchanged_and_finally_runs() -> None:
    events: list[str] = []

    @contextmanager
    def block() -> Iterator[None]:
        try:
            yield
            events.append("after yield")  # must not run when the block raised
        finally:
            events.append("finally")

    error = KeyError("mine")
    with pytest.raises(KeyError) as caught:
        with block():
            raise error

    assert caught.value is error
    assert events == ["finally"]


def test_a_generator_may_swallow_the_block_exception_or_replace_it() -> None:
    @contextmanager
    def swallowing() -> Iterator[None]:
        try:
            yield
        except ValueError:
            pass

    @contextmanager
    def replacing() -> Iterator[None]:
        try:
            yield
        except ValueError as exc:
            raise RuntimeError("replaced") from exc

    with swallowing():
        raise ValueError("swallowed")
    with pytest.raises(RuntimeError, match="replaced"):
        with replacing():
            raise ValueError("replaced below")


def test_a_failure_after_the_yield_is_raised_from_the_with_statement() -> None:
    @contextmanager
    def failing() -> Iterator[None]:
        yield
        raise AssertionError("checked at exit")

    with pytest.raises(AssertionError, match="checked at exit"):
        with failing():
            pass


def test_generators_that_do_not_yield_exactly_once_are_errors() -> None:
    @contextmanager
    def never() -> Iterator[None]:
        return
        yield  # pragma: no cover

    @contextmanager
    def twice() -> Iterator[None]:
        yield
        yield

    with pytest.raises(RuntimeError, match="didn't yield"):
        with never():
            pass
    with pytest.raises(RuntimeError, match="didn't stop"):
        with twice():
            pass


def test_the_helper_itself_in_a_with_statement_says_to_call_it() -> None:
    @contextmanager
    def block() -> Iterator[None]:
        yield

    with pytest.raises(TypeError, match=r"block is a function: write `with block\(\):`"):
        with block:  # type: ignore[attr-defined]
            pass


def test_a_method_is_bound_like_a_function() -> None:
    class Owner:
        @contextmanager
        def block(self, name: str) -> Iterator[tuple[object, str]]:
            yield self, name

    owner = Owner()
    with owner.block("x") as value:
        assert value == (owner, "x")
