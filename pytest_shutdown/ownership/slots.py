"""The ``__slots__`` names a class declares itself, for the walks that name an object's
attributes (the owner search, the holder names, the backref edges)."""

from __future__ import annotations

__all__ = ["slot_names"]


def slot_names(klass: type) -> tuple[str, ...]:
    """``klass``'s own ``__slots__`` as names: ``__slots__ = "name"`` is one slot, not four
    letters; anything but strings (a hostile or odd declaration) is left out."""
    slots = klass.__dict__.get("__slots__", ()) or ()
    if isinstance(slots, str):
        return (slots,)
    try:
        return tuple(slot for slot in slots if isinstance(slot, str))
    except TypeError:  # not iterable
        return ()
