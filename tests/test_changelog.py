"""CHANGELOG.md agrees with the package: its newest release is the version the package says it is,
and every name a user meets in the code (finding codes, resource kinds and their ``allow_leaks``
keywords, options, deprecated names) is in it, so that no release ships what it does not announce.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest_shutdown
from pytest_shutdown import FINDING_CODES
from pytest_shutdown.plugin.settings import _OPTIONS
from pytest_shutdown.resources import allow_keys, kind_names

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
#: Keep a Changelog's headings: ``## [Unreleased]``, then ``## [X.Y.Z] - YYYY-MM-DD``.
RELEASE = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d\d-\d\d)$", re.M)
VERSION_HEADINGS = re.compile(r"^## \[.*$", re.M)


def package_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    assert found is not None, "pyproject.toml has no version"
    return found.group(1)


def moved_below_helpers() -> list[str]:
    """The deprecated ``checks.<module>`` paths that moved elsewhere than helpers/ (read, not
    imported: importing ``pytest_shutdown.checks`` installs its import alias)."""
    tree = ast.parse((ROOT / "pytest_shutdown" / "checks" / "__init__.py").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and "_BELOW" in ast.unparse(node):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    raise AssertionError("pytest_shutdown/checks/__init__.py has no _BELOW")


def sections(title: str) -> str:
    """Every ``### title`` section of every release, one after the other."""
    parts = re.split(r"^(#{2,3} .*)$", CHANGELOG, flags=re.M)
    heads_and_bodies = zip(parts[1::2], parts[2::2], strict=True)
    return "\n".join(body for head, body in heads_and_bodies if head == title)


def test_the_newest_release_is_the_package_version() -> None:
    headings = VERSION_HEADINGS.findall(CHANGELOG)
    assert headings[0] == "## [Unreleased]", headings[:2]
    releases = [tuple(map(int, m["version"].split("."))) for m in RELEASE.finditer(CHANGELOG)]
    assert len(releases) == len(headings) - 1, f"not all are '## [X.Y.Z] - DATE': {headings}"
    assert releases == sorted(releases, reverse=True), "releases are listed newest first"
    newest = RELEASE.search(CHANGELOG)
    assert newest is not None
    assert newest["version"] == package_version() == pytest_shutdown.__version__


def test_every_finding_code_kind_and_option_is_announced() -> None:
    def missing(names: Iterable[str]) -> list[str]:
        return [n for n in names if f"`{n}`" not in CHANGELOG]

    assert missing(FINDING_CODES) == []
    assert missing(kind_names()) == []
    assert missing(allow_keys()) == []
    options = [f"--shutdown-{name}" for name, *_ in _OPTIONS]
    assert [o for o in options if not re.search(f"`{o}\\b", CHANGELOG)] == []


def test_every_deprecated_name_is_listed_as_deprecated() -> None:
    deprecated = sections("### Deprecated")
    top_level = [
        n
        for n in pytest_shutdown._DEPRECATED
        if f"`{n}`" not in deprecated and f"`pytest_shutdown.{n}`" not in deprecated
    ]
    assert top_level == []
    assert [m for m in moved_below_helpers() if f"`checks.{m}`" not in deprecated] == []
    assert "`pytest_shutdown.checks.<module>`" in deprecated
    # the plugin's modules that left the package root (issue 47), by their old names
    old_paths = [old.removeprefix("pytest_shutdown.") for old in pytest_shutdown._MOVED_MODULES]
    unlisted = [
        p
        for p in old_paths
        if f"`{p}`" not in deprecated and f"`pytest_shutdown.{p}`" not in deprecated
    ]
    assert unlisted == []
