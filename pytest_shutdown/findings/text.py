"""Findings as text: :func:`key_fact_lines`, the few facts that say *where* (always shown),
:func:`all_fact_lines`, every fact of ``details`` (``-vv`` or ``--shutdown-details``),
:func:`merged`, identical findings of a test as one with a count, and :func:`error_headline`,
the codes and objects of a test's findings on one line (pytest's short summary shows it).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

TREE_CODES = frozenset({"orphan-process", "exit-hang"})
#: The warm tree launcher, whose command line every forked tree process keeps.
LAUNCHER_MODULE = "pytest_shutdown.helpers.tree_launcher"
CMDLINE_CHARS = 300

# Compiled by ``re`` on first use: most sessions never read a stack.
_FRAME = r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)'
_THREAD_HEAD = r"(?i)^(Current thread|Thread) 0x[0-9a-f]+ "
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_FRAMES = os.path.join(_PACKAGE, "helpers") + os.sep


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Imported on first use: ``sysconfig`` costs every session more than this module."""
    import sysconfig  # noqa: PLC0415

    paths = sysconfig.get_paths()
    found = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(p) + os.sep for p in found if p))


def is_user_frame(path: str) -> bool:
    """Not the standard library, an installed package or pytest-shutdown's own checks."""
    if path.startswith("<"):
        return False  # <frozen ...>, <string>
    full = os.path.abspath(path)
    if full.startswith(_OWN_FRAMES):
        return False
    return not any(full.startswith(d) for d in _library_dirs())


def first_user_frame(stacks: str) -> str:
    """The first frame of user code in a faulthandler dump; ``""`` when there is none."""
    for line in stacks.splitlines():
        if re.match(_THREAD_HEAD, line):
            continue
        match = re.match(_FRAME, line)
        if match and is_user_frame(match.group("file")):
            return f"{match.group('file')}:{match.group('line')} in {match.group('func')}"
    return ""


def cmdline_text(parts: Any) -> str:
    """A process's command line on one line, cut at ``CMDLINE_CHARS`` ("?" when unknown; every
    character is in the details)."""
    text = parts if isinstance(parts, str) else " ".join(str(p) for p in (parts or []))
    text = text.replace("\n", "\\n")
    if not text:
        return "?"
    return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 3] + "..."


def key_fact_lines(code: str, details: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """The facts that locate a finding, one per line (empty for codes that have none)."""
    if code not in TREE_CODES:
        return []
    lines = []
    if details.get("cmdline"):
        line = f"{indent}command line: {cmdline_text(details['cmdline'])}"
        if LAUNCHER_MODULE in cmdline_text(details["cmdline"]):
            line += f" (a fork of the tree launcher, now named {details.get('name') or '?'})"
        lines.append(line)
    if details.get("level"):
        cell = ", ".join(f"{key} {details[key]}" for key in ("signal", "phase") if details.get(key))
        lines.append(f"{indent}level: {details['level']}" + (f" ({cell})" if cell else ""))
    if code == "exit-hang":
        frame = first_user_frame(str(details.get("stacks") or ""))
        if frame:
            lines.append(f"{indent}first user frame: {frame}")
    return lines


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=repr, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def all_fact_lines(details: Mapping[str, Any], indent: str = "    ") -> list[str]:
    """Every fact of ``details``, sorted by name; a value of several lines is indented below."""
    lines = []
    for key in sorted(details):
        text = _plain(details[key])
        if "\n" in text:
            lines.append(f"{indent}{key}:")
            lines.extend(f"{indent}  {line}" for line in text.rstrip("\n").splitlines())
        else:
            lines.append(f"{indent}{key}: {text}")
    return lines


def finding_lines(
    finding: Mapping[str, Any], *, details: bool = False, times: int = 1
) -> list[str]:
    """``[code] message``, the facts that locate the finding and, with ``details``, every fact;
    ``times``: how many identical findings this line stands for."""
    facts = finding.get("details") or {}
    lines = [f"[{finding['code']}] {finding['message']}{times_suffix(times)}"]
    lines.extend(key_fact_lines(str(finding["code"]), facts))
    if details and facts:
        lines.append("  details:")
        lines.extend(all_fact_lines(facts))
    return lines


#: Under a summary with findings: where the rest is (shown unless the details already are).
DETAILS_HINT = (
    "stacks and every fact of each finding: --shutdown-details or -vv; what each code means: "
    "docs/codes.md"
)
#: A message that counts what it found names the objects after its first colon.
_COUNTED = r"^\d+ [^:]*: (?P<objects>.+?)\.?$"


def times_suffix(times: int) -> str:
    """`` (5 times)`` after a line that stands for identical findings; nothing for one."""
    return f" ({times} times)" if times > 1 else ""


def merged(findings: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], int]]:
    """Each distinct finding (same code, same message) once, in first-seen order, with how many
    times it was found."""
    seen: dict[tuple[str, str], list[Any]] = {}
    for finding in findings:
        key = (str(finding.get("code")), str(finding.get("message")))
        entry = seen.get(key)
        if entry is None:
            seen[key] = [finding, 1]
        else:
            entry[1] += 1
    return [(finding, times) for finding, times in seen.values()]


def finding_object(finding: Mapping[str, Any]) -> str:
    """What a finding is about, as its message names it: the objects a counting message lists
    after its colon (``'pool' (target app.work, started by ...)``), else the whole message."""
    message = str(finding.get("message", ""))
    match = re.match(_COUNTED, message, re.DOTALL)
    return match.group("objects") if match else message.rstrip(".")


def error_headline(findings: Iterable[Mapping[str, Any]]) -> str:
    """``shutdown guard: [code] object; [code] object (2 times)``: the first line of the guard's
    error, which pytest's short test summary shows after ``ERROR nodeid -``."""
    parts = [
        f"[{finding['code']}] {finding_object(finding)}{times_suffix(times)}"
        for finding, times in merged(findings)
    ]
    return "shutdown guard: " + "; ".join(parts)
