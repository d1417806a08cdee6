"""Colour in the ``shutdown`` section as pytest colours its own summary: the finding code of
each finding line and the verdict of the section's first line, through the terminal writer's
markup (which writes no escape codes under ``--color=no``)."""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["coloured"]

#: ``nodeid: [code] message``, or a finding's own ``[code] message``.
_FINDING = re.compile(r"^(?P<before>(?:\S.*?: )?)(?P<code>\[[a-z][a-z-]*\])(?P<after> .*)$")
#: The first line's verdict: ``2 of 5 tests with findings``, ``no findings in 5 tests``.
_VERDICT = re.compile(
    r"^(?P<before>)(?P<code>\d+ of \d+ tests? with findings|no findings in \d+ tests?)"
    r"(?P<after>.*)$"
)


def coloured(line: str, paint: Callable[[str], str], codes: frozenset[str] | set[str]) -> str:
    """``line`` with its finding code (one of ``codes``) or its verdict passed through
    ``paint``; any other line as it is."""
    for pattern in (_FINDING, _VERDICT):
        match = pattern.match(line)
        if match and (pattern is _VERDICT or match.group("code")[1:-1] in codes):
            return match.group("before") + paint(match.group("code")) + match.group("after")
    return line
