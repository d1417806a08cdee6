"""mkdocs hooks (``hooks:`` in mkdocs.yml): the pages made from the code itself at build time.

Two pages hold a marker line that is replaced when the site is built, so that they cannot drift
from the code:

* ``docs/codes.md``: ``<!-- generated: finding codes -->`` becomes a table of every code of
  :data:`pytest_shutdown.FINDING_CODES` with its meaning (a code added there appears here);
* ``docs/reference.md``: ``<!-- generated: api reference -->`` becomes one mkdocstrings
  directive (``::: module.name``) per public name of the public modules (their ``__all__``);
  mkdocstrings renders each from its signature and docstring.

``tests/test_docs_generated.py`` builds the site and checks that every public name, every
parameter of its signature and every finding code is on it.
"""

from __future__ import annotations

import importlib
from typing import Any

CODES_MARKER = "<!-- generated: finding codes -->"
REFERENCE_MARKER = "<!-- generated: api reference -->"

#: The public modules, in the order of the reference page.
PUBLIC_MODULES = (
    "pytest_shutdown",
    "pytest_shutdown.engine",
    "pytest_shutdown.devices",
    "pytest_shutdown.orphans",
    "pytest_shutdown.harness",
)
#: Names documented in prose rather than rendered (a plain string).
NOT_RENDERED = frozenset({"__version__"})


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def codes_markdown() -> str:
    """The table of every finding code and its meaning, in the order of ``FINDING_CODES``."""
    from pytest_shutdown.findings.finding import FINDING_CODES  # noqa: PLC0415 - fresh at build time

    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| `{code}` | {_cell(meaning)} |" for code, meaning in FINDING_CODES.items()]
    return "\n".join(rows) + "\n"


def defining_paths(module_name: str) -> list[tuple[str, str]]:
    """``(public name, dotted path where it is defined)`` for each name of ``__all__``.

    The lazy re-exports (``_LAZY``) say where a name lives without importing it (so no torch);
    a name defined or imported eagerly is looked up on the module.
    """
    module = importlib.import_module(module_name)
    lazy: dict[str, str] = getattr(module, "_LAZY", {})
    paths = []
    for name in module.__all__:
        if name in NOT_RENDERED:
            continue
        if name in lazy:
            home = lazy[name]
        else:
            value = getattr(module, name)
            home = getattr(value, "__module__", None) or module_name
            if not isinstance(home, str) or not hasattr(importlib.import_module(home), name):
                home = module_name
        paths.append((name, f"{home}.{name}"))
    return paths


def reference_markdown() -> str:
    """One section per public module, one mkdocstrings directive per public name."""
    parts: list[str] = []
    rendered: dict[str, str] = {}
    for module_name in PUBLIC_MODULES:
        parts.append(f"## `{module_name}`\n")
        for name, path in defining_paths(module_name):
            if path in rendered:  # one object exported by two modules: one entry, one anchor
                parts.append(
                    f"`{module_name}.{name}`: the same object as "
                    f"[`{rendered[path]}`](#{path}).\n"
                )
                continue
            rendered[path] = f"{module_name}.{name}"
            parts.append(
                f"::: {path}\n"
                "    options:\n"
                f"      heading: \"{module_name}.{name}\"\n"
                "      toc_label: \"" + name + "\"\n"
            )
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    if CODES_MARKER in markdown:
        markdown = markdown.replace(CODES_MARKER, codes_markdown())
    if REFERENCE_MARKER in markdown:
        markdown = markdown.replace(REFERENCE_MARKER, reference_markdown())
    return markdown
