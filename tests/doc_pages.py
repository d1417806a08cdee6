"""The pages of README.md and docs/*.md as their fenced code blocks, for the tests that check
what the pages show (tests/test_readme.py, tests/test_quickstart.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    page: str
    line: int
    before: str  # the text between the previous block and this one

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(pages: list[Path] = PAGES) -> list[Block]:
    """Every fenced block of ``pages``, in page order."""
    found: list[Block] = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        last = 0
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[last : match.start()]
            found.append(Block(match.group(1), match.group(2), name, line, before))
            last = match.end()
    return found
