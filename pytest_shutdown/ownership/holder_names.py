"""Which attribute holds an object, as its user names it (``Server._sock``): one
``gc.get_referrers`` pass for all the objects of a finding, made only when one is reported."""

from __future__ import annotations

import gc
import types
from collections.abc import Sequence

from pytest_shutdown.ownership.slots import slot_names

__all__ = ["holder_names"]

#: Referrers that say nothing about who holds it: containers name no owner, frames are running
#: code (the guard's own among them).
_ANONYMOUS = (dict, list, tuple, set, frozenset, types.FrameType, types.CellType)


def holder_names(objects: Sequence[object]) -> dict[int, str]:
    """``id(obj)`` -> ``Class.attribute`` of an instance attribute that holds it; an object
    held only by containers, frames or nothing is left out."""
    if not objects:
        return {}
    wanted = {id(obj): obj for obj in objects}
    found: dict[int, str] = {}
    dicts: list[dict[str, object]] = []
    referrers = gc.get_referrers(*objects)
    try:
        for referrer in referrers:
            if isinstance(referrer, dict):
                dicts.append(referrer)  # an instance's materialised __dict__: its owner below
            elif not isinstance(referrer, _ANONYMOUS) and not isinstance(referrer, type):
                _name_attributes(referrer, vars_of(referrer), wanted, found)
        if dicts and len(found) < len(wanted):
            for owner in gc.get_referrers(*dicts):
                attrs = vars_of(owner)
                if attrs is not None and any(attrs is d for d in dicts):
                    _name_attributes(owner, attrs, wanted, found)
    finally:
        del referrers, dicts
    return found


def vars_of(obj: object) -> dict[str, object] | None:
    """``obj.__dict__`` when it is a plain instance's (never a user's ``__getattr__``)."""
    if isinstance(obj, (*_ANONYMOUS, type, types.ModuleType)):
        return None
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return attrs if isinstance(attrs, dict) else None


def _name_attributes(
    owner: object, attrs: dict[str, object] | None, wanted: dict[int, object], found: dict[int, str]
) -> None:
    slots = [slot for klass in type(owner).__mro__ for slot in slot_names(klass)]
    pairs = list((attrs or {}).items())
    for slot in slots:
        try:
            pairs.append((slot, object.__getattribute__(owner, slot)))
        except (AttributeError, TypeError):
            continue
    for name, value in pairs:
        key = id(value)
        if key in wanted and wanted[key] is value and key not in found:
            found[key] = f"{type(owner).__qualname__}.{name}"
