"""``atexit.register`` callbacks that keep a test's objects alive until exit
(``atexit-holds-object``).

:mod:`pytest_shutdown.ownership.atexit_calls` records every ``atexit.register`` call. One made
during a test, still registered at its end, whose callback reaches an object the test created
holds that object until exit (SGLang's ``Engine.__init__`` registers ``self.shutdown``, so every
engine stays alive). Never reported: callbacks holding only plain values, registrations made by
an import, and those of a library's singleton (tqdm's ``cls.monitor = TMonitor(...)``), even once
released: atexit is how it is meant to end. Nothing is restored: that would change their exit.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.ownership import atexit_calls, origins
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind

__all__ = ["AtexitKind"]


class AtexitKind(ObjectKind):
    """Registrations (by identity) made since the snapshot and still registered."""

    name = "atexit"
    allow_key = "atexit"
    mark = "atexit_count"

    def __init__(self) -> None:
        atexit_calls.install()

    def close(self) -> None:
        atexit_calls.uninstall()

    def snapshot(self) -> int:
        return atexit_calls.count()

    mark_reading = staticmethod(atexit_calls.count)

    def absorb(self, before: Any, start: Any, end: Any) -> Any:
        return before  # counts: a fixture's registrations are told apart by ownership

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[Any]:
        if allow is True or atexit_calls.count() == before:
            return ()
        return tuple(
            r
            for r in atexit_calls.since(before)
            if (held := atexit_calls.reached_objects(r)) and not _process_lifetime(r, held[0])
        )

    def targets(self, items: Sequence[Any]) -> Mapping[Any, object]:
        # The object the callback holds decides whose the registration is.
        found: dict[Any, object] = {}
        for registration in items:
            held = atexit_calls.reached_objects(registration)
            if held:
                found[registration] = held[0]
        return found

    def known_referrers(self, items: Sequence[Any]) -> Mapping[Any, tuple[object, ...]]:
        # A bound method (a partial) refers to its object: no heap walk to find it.
        found: dict[Any, tuple[object, ...]] = {}
        for registration in items:
            held = atexit_calls.reached_objects(registration)
            if not held:
                continue
            target = held[0]
            roots = (registration.func, *registration.args, *registration.kwargs.values())
            direct = tuple(
                root
                for root in roots
                if root is not target and any(c is target for c in gc.get_referents(root))
            )
            if direct:
                found[registration] = direct
        return found

    def settle(self, items: Sequence[Any], deadline: float) -> Sequence[Any]:
        alive = atexit_calls.registrations()
        return tuple(r for r in items if any(r is a for a in alive))

    def findings(
        self, items: Sequence[Any], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        found = []
        for registration in items:
            held = atexit_calls.reached_objects(registration)
            what = ", ".join(sorted({_type_name(o) for o in held}))
            origin = registration.origin
            site = origins.render_origin(origin) if origin else ""
            called = origins.start_site(origin) if origin else None
            by = f" (by {called})" if called else ""
            found.append(
                Finding(
                    "atexit-holds-object",
                    f"atexit.register({registration.describe()}) in {subject}{by} keeps "
                    f"{what} alive until the interpreter exits (still registered at the end "
                    "of the test; atexit's hold is invisible to gc.get_referrers).",
                    {
                        "callback": registration.describe(),
                        "held": [_type_name(o) for o in held],
                        "registered_at": site,
                        "site": called,
                        "started_in": registration.test,
                        **dict(extra or {}),
                    },
                )
            )
        return found


def _type_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _process_lifetime(registration: Any, held: object) -> bool:
    """A registration made by an import, or for a singleton its library released (one still held
    is left to the ownership search)."""
    origin = registration.origin
    if origin is None:
        return False
    if getattr(origin, "imported", None) is not None:
        return True
    from pytest_shutdown.ownership.owners import singleton_slot  # noqa: PLC0415 - only when left

    try:
        slot = singleton_slot(origin, held)
    except Exception:  # noqa: BLE001 - reading the site must never break the check
        return False
    return slot is not None and slot[1] is not held
