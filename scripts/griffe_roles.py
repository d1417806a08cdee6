"""A griffe extension for the API reference: Sphinx roles in docstrings become inline code.

The docstrings name other objects the Sphinx way (``:class:`ShutdownContractError```,
``:func:`~pytest_shutdown.timeout_passed_to```); the site renders docstrings as Markdown, where
those roles would show as raw text. Each becomes the name in backticks (the last dotted part for
a ``~`` target, as Sphinx shows it).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``:role:`target``` -> ``target`` in backticks (``~a.b.c`` -> ``c``)."""

    def replace(match: re.Match[str]) -> str:
        target = match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"

    return ROLE.sub(replace, text)


class SphinxRolesAsCode(griffe.Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
