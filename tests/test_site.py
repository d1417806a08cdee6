"""The docs site a newcomer navigates, checked on the built HTML instead of a screenshot.

The navigation has at most seven top-level sections (tabs) and two levels, a section and its
pages: no page hides in a sub-section. Every built page is reachable from it, code blocks are
highlighted, the search index covers every page and wide code blocks scroll. The strict build
(``make docs``) fails on a link to a missing anchor or page, and passes when the link is right.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SECTIONS_AT_MOST = 7
#: Exactly: a top-level section and its pages (grouped, not flat). A third level would be a
#: sub-section that a reader must find and open.
NAV_DEPTH = 2

_VOID = frozenset({"area", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"})


class PrimaryNav(HTMLParser):
    """The entries of a material page's site navigation: ``(depth, href)``, depth 1 for the
    top level, ``href`` None for a section title. The page's own table of contents, which
    material nests inside the navigation of the current page, is left out."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[int, str | None]] = []
        self._open: list[str] = []  # each open element: "item", "toc", "nav" or "other"
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        if "md-nav--primary" in classes:
            self._inside = True
        kind = "other"
        if "md-nav--secondary" in classes:
            kind = "toc"
        elif tag == "li" and "md-nav__item" in classes:
            kind = "item"
        self._open.append(kind)
        if not self._inside or "toc" in self._open:
            return
        depth = self._open.count("item")
        if kind == "item":
            self.entries.append((depth, None))
        elif tag == "a" and "md-nav__link" in classes and self.entries:
            self.entries[-1] = (depth, dict(attrs).get("href"))

    def handle_endtag(self, tag: str) -> None:
        if tag not in _VOID and self._open:
            self._open.pop()
            if not self._open:
                self._inside = False


def _nav(page: Path) -> list[tuple[int, str | None]]:
    parser = PrimaryNav()
    parser.feed(page.read_text(encoding="utf-8"))
    assert parser.entries, f"{page} has no site navigation"
    return parser.entries


def _pages(site: Path) -> set[str]:
    """Every built page, as its folder relative to the site root (``.`` for the home page)."""
    return {p.parent.relative_to(site).as_posix() for p in site.rglob("index.html")}


def test_at_most_seven_top_level_sections(docs_site: Path) -> None:
    top = [entry for entry in _nav(docs_site / "index.html") if entry[0] == 1]
    assert 2 <= len(top) <= SECTIONS_AT_MOST, top
    tabs = re.findall(r'<li class="md-tabs__item', (docs_site / "index.html").read_text())
    assert len(tabs) == len(top), "each top-level entry is one tab, on one row"


def test_the_navigation_is_two_levels_deep_on_every_page(docs_site: Path) -> None:
    for page in sorted(docs_site.rglob("index.html")):
        depth = max(depth for depth, _ in _nav(page))
        assert depth == NAV_DEPTH, f"{page.relative_to(docs_site)}: {depth} levels"


def test_every_page_is_reachable_from_the_navigation(docs_site: Path) -> None:
    links = {href for _, href in _nav(docs_site / "index.html") if href is not None}
    reached = {posixpath.normpath(href) for href in links}
    assert reached == _pages(docs_site)
    assert len(_pages(docs_site)) == len(list((ROOT / "docs").glob("*.md")))


def test_python_blocks_are_highlighted(docs_site: Path) -> None:
    page = (docs_site / "quickstart" / "index.html").read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="[^"]*\bhighlight"><pre>.*?</pre></div>', page, re.S)
    python = [b for b in blocks if '<span class="k">def</span>' in b]
    assert python, "no highlighted Python block on the quick start"
    assert all('<span class="nf">' in block for block in python)  # the function's name


def test_the_search_index_covers_every_page(docs_site: Path) -> None:
    index = json.loads((docs_site / "search" / "search_index.json").read_text(encoding="utf-8"))
    located = {posixpath.normpath(doc["location"].split("#")[0] or ".") for doc in index["docs"]}
    assert located == _pages(docs_site)
    assert '"search.suggest"' in (docs_site / "index.html").read_text(encoding="utf-8")


def test_the_finding_codes_block_scrolls_instead_of_being_cut(docs_site: Path) -> None:
    """The FINDING_CODES value on the reference page is a ``pre > code`` block of the page's
    text, and the theme's stylesheet, linked from the page, scrolls such blocks sideways."""
    page = (docs_site / "reference" / "index.html").read_text(encoding="utf-8")
    start = page.index('id="pytest_shutdown.findings.finding.FINDING_CODES"')
    block = re.search(r"<pre><span></span><code>(.*?)</code></pre>", page[start:], re.S)
    assert block is not None and "cleanup-repeated" in block.group(1)
    assert page.index('<article class="md-content__inner md-typeset">') < start
    (sheet,) = re.findall(r'href="\.\./(assets/stylesheets/main\.[\w.]+\.css)"', page)
    rule = re.search(r"\.md-typeset pre>code\{([^}]*)\}", (docs_site / sheet).read_text())
    assert rule is not None and "overflow:auto" in rule.group(1)


# -- the strict build checks links and anchors ------------------------------------------------


def _config_with(docs: Path) -> str:
    """The project's mkdocs.yml, its checks and theme, on a two-page site in ``docs``."""
    import yaml  # mkdocs' own dependency

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    kept = {key: config[key] for key in ("strict", "theme", "validation", "markdown_extensions")}
    kept.update(site_name="links", docs_dir=str(docs), nav=["index.md", "other.md"])
    return yaml.safe_dump(kept)


@pytest.mark.parametrize(
    ("link", "builds"),
    [("other.md#present", True), ("other.md#absent", False), ("missing.md", False)],
)
def test_the_strict_build_fails_on_a_broken_link_or_anchor(
    tmp_path: Path, link: str, builds: bool
) -> None:
    pytest.importorskip("material", reason="mkdocs-material comes with the 'docs' extra")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\nSee [the other page]({link}).\n")
    (docs / "other.md").write_text("# Other\n\n## Present\n\nHere.\n")
    (tmp_path / "mkdocs.yml").write_text(_config_with(docs))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode == 0) is builds, result.stderr[-2000:]
    if not builds:
        assert link.split("#")[-1] in result.stderr
