"""``lazy_dataclass``: the same class as ``dataclass`` makes, generated at its first instance."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
from dataclasses import field

import pytest

from pytest_shutdown._fast.lazy_dataclass import FrozenRecord, lazy_dataclass


@lazy_dataclass(frozen=True)
class Frozen:
    name: str
    items: tuple[int, ...] = ()
    extra: dict[str, int] = field(default_factory=dict, compare=False)


@lazy_dataclass
class Mutable:
    count: int = 0
    seen: list[str] = field(default_factory=list)


@lazy_dataclass(eq=False)
class ByIdentity:
    value: int


def test_nothing_is_generated_before_the_first_instance() -> None:
    @lazy_dataclass(frozen=True)
    class Later:
        a: int

    assert "__dataclass_fields__" not in Later.__dict__
    assert "__init__" not in Later.__dict__
    Later(1)
    assert [f.name for f in dataclasses.fields(Later)] == ["a"]


def test_a_frozen_record_behaves_as_a_frozen_dataclass() -> None:
    record = Frozen("a", (1, 2))
    assert record == Frozen("a", (1, 2), {"ignored": 1})
    assert record != Frozen("b")
    assert hash(record) == hash(Frozen("a", (1, 2)))
    assert repr(record) == "Frozen(name='a', items=(1, 2), extra={})"
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.name = "b"  # type: ignore[misc]
    assert dataclasses.replace(record, name="c") == Frozen("c", (1, 2))
    assert dataclasses.asdict(record) == {"name": "a", "items": (1, 2), "extra": {}}


def test_a_mutable_record_gets_fresh_defaults_and_no_hash() -> None:
    first, second = Mutable(), Mutable()
    first.seen.append("x")
    assert second.seen == [] and first != second
    with pytest.raises(TypeError):
        hash(first)


def test_eq_false_compares_by_identity() -> None:
    assert ByIdentity(1) != ByIdentity(1)
    one = ByIdentity(1)
    assert one == one and one.value == 1


def test_copies_and_pickles_are_equal() -> None:
    record = Frozen("p", (3,), {"k": 1})
    assert copy.copy(record) == record
    assert copy.deepcopy(record) == record
    assert pickle.loads(pickle.dumps(record)) == record


def test_the_first_instances_made_at_once_by_many_threads_share_one_class() -> None:
    @lazy_dataclass(frozen=True)
    class Raced:
        a: int

    made: list[Raced] = []
    errors: list[BaseException] = []
    go = threading.Event()

    def make(n: int) -> None:
        go.wait(5)
        try:
            made.append(Raced(n))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join(5)
    assert errors == []
    assert sorted(r.a for r in made) == list(range(16))
    assert Raced(1) == Raced(1)


def test_the_signature_is_the_fields_not_the_deferring_constructor() -> None:
    import inspect

    @lazy_dataclass(frozen=True)
    class Signed:
        a: int
        b: str = "x"

    assert str(inspect.signature(Signed)) == "(a: 'int', b: 'str' = 'x') -> None"
    assert Signed(1) == Signed(1, "x")
    assert list(inspect.signature(Frozen).parameters) == ["name", "items", "extra"]


def test_an_instance_made_while_another_thread_completes_the_class_has_its_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second thread's first instance, made while the first thread is generating the class's
    methods, waits for them: it never gets the bare ``object.__init__`` (an instance without
    its fields: CI's ``'Registration' object has no attribute 'func'``)."""

    @lazy_dataclass(eq=False)
    class Raced:
        func: str

    made: list[Raced] = []
    others: list[threading.Thread] = []
    generate = dataclasses.dataclass

    def generate_while_another_thread_makes_one(cls: type, **options: object) -> object:
        other = threading.Thread(target=lambda: made.append(Raced("second")))
        others.append(other)
        other.start()
        other.join(0.3)  # blocked on the class's lock (correct) or done at once (the bug)
        return generate(cls, **options)  # type: ignore[call-overload]

    monkeypatch.setattr(dataclasses, "dataclass", generate_while_another_thread_makes_one)
    first = Raced("first")
    monkeypatch.undo()
    others[0].join(5)
    assert first.func == "first"
    assert [r.func for r in made] == ["second"]


class Pair(FrozenRecord):
    __slots__ = ("a", "b")
    a: int
    b: tuple[int, ...]

    def __init__(self, a: int, b: tuple[int, ...]) -> None:
        super().__init__(a, b)


def test_a_frozen_record_compares_hashes_and_copies_by_its_fields() -> None:
    record = Pair(1, (2,))
    assert record == Pair(1, (2,)) and hash(record) == hash(Pair(1, (2,)))
    assert record != Pair(1, (3,)) and record != (1, (2,))
    assert copy.copy(record) == record == pickle.loads(pickle.dumps(record))
    assert repr(record) == "Pair(a=1, b=(2,))"


def test_a_frozen_record_refuses_changes_and_a_wrong_count() -> None:
    record = Pair(1, (2,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.b
    with pytest.raises(TypeError, match="Pair takes 2 values"):
        FrozenRecord.__init__(record, 1)
