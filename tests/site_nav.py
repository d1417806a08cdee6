"""The pages of the docs site's navigation, read from mkdocs.yml without mkdocs."""

from __future__ import annotations

import re
from pathlib import Path

#: A nav entry that names a page: ``- Title: page.md`` at any depth (a section's pages are
#: indented under it); a quoted title may hold a colon.
_PAGE_ENTRY = re.compile(r'^\s*- (?:"[^"\n]*"|[^:"\n]+): (\S+\.md)\s*$', re.M)


def nav_pages(config: Path) -> list[str]:
    """Every page of ``config``'s ``nav:``, in reading order, sections flattened."""
    return _PAGE_ENTRY.findall(config.read_text(encoding="utf-8"))
