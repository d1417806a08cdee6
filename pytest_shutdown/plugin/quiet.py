"""``--shutdown-quiet``: an ERROR record or a traceback written while a test's fixtures shut down
is a ``shutdown-logged-error`` finding of that test (opt-in; the guard must be on).

When on, :class:`QuietTeardowns` wraps each test's teardown phase in an
:class:`~pytest_shutdown.helpers.quiet.ErrorWatch`: log records at ERROR or above of any logger
(through ``logging.Logger.callHandlers``, unchanged for every handler: pytest's caplog and log
sections see what they always saw), and the teardown's stderr as pytest captured it (with
``--capture=fd``, the default, that includes what child processes write to the inherited
stderr; with ``-s`` a tee on ``sys.stderr`` reads the process's own). The findings go to the
guard through ``item.stash[QUIET_FINDINGS]`` and take its normal path: warn or fail, the
terminal and JSON reports. When off nothing is registered: no wrapper, no handler, no cost.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

#: The findings of one test's teardown, for the guard (:mod:`pytest_shutdown.plugin.guard`).
QUIET_FINDINGS = pytest.StashKey[list[Any]]()

QUIET_DESC = """
Report an ERROR (or CRITICAL) log record, or a traceback written to stderr, during a test's
teardown (the graceful shutdown of its fixtures) as a shutdown-logged-error finding of the test,
naming the logger, the message, the exception type and where it was logged; with the default
--capture=fd this includes child processes' stderr. Needs the guard on. Default: off.
""".strip().replace("\n", " ")
QUIET_ALLOW_DESC = """
Regular expressions (one a line) searched in the logger name, the message and the exception line
of each error --shutdown-quiet finds: a match is expected, not a finding.
""".strip().replace("\n", " ")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def add_quiet_options(parser: pytest.Parser) -> None:
    """``--shutdown-quiet``, ini ``shutdown_quiet`` and ``shutdown_quiet_allow``."""
    group = parser.getgroup("shutdown")
    group.addoption(
        "--shutdown-quiet",
        dest="shutdown_quiet",
        action="store_true",
        default=None,
        help=QUIET_DESC,
    )
    parser.addini("shutdown_quiet", QUIET_DESC, default="")
    parser.addini("shutdown_quiet_allow", QUIET_ALLOW_DESC, type="linelist", default=[])


def quiet_allow(config: pytest.Config) -> tuple[str, ...]:
    """The ini's allow patterns, each checked now: a bad one is a UsageError naming it."""
    import re  # noqa: PLC0415 - with the option on only

    patterns = tuple(str(p).strip() for p in config.getini("shutdown_quiet_allow") or ())
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise pytest.UsageError(
                f"shutdown_quiet_allow (ini): {pattern!r} is not accepted ({exc}); accepted: "
                "regular expressions, one a line"
            ) from None
    return tuple(p for p in patterns if p)


def quiet_enabled(config: pytest.Config) -> bool:
    """``--shutdown-quiet``, else the ini key ``shutdown_quiet`` (true/false, yes/no, on/off,
    1/0); a bad ini value is a UsageError naming the key and the accepted values."""
    if config.getoption("shutdown_quiet", default=None):
        return True
    value = str(config.getini("shutdown_quiet") or "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise pytest.UsageError(
        f"shutdown_quiet (ini): {value!r} is not accepted; accepted: "
        f"{', '.join(_TRUE)}, {', '.join(v for v in _FALSE if v)}"
    )


class QuietTeardowns:
    """The per-teardown watch; registered before the guard, so that the guard's teardown wrapper
    (also ``tryfirst``) is outside it and pytest's capture wrapper inside it."""

    def __init__(self, config: pytest.Config, allow: tuple[str, ...]) -> None:
        self.allow = allow
        capture = str(getattr(config.option, "capture", "fd"))
        #: With capture off, nobody else keeps the teardown's stderr: a tee does.
        self.tee = capture == "no"

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, object, object]:
        __tracebackhide__ = True  # a fixture's teardown error shows the user's frames alone
        from pytest_shutdown.helpers.quiet import ErrorWatch  # noqa: PLC0415 - on first use

        watch = ErrorWatch(allow=self.allow, tee_stderr=self.tee).start()
        try:
            return (yield)
        finally:
            watch.stop()
            for when, key, text in getattr(item, "_report_sections", ()):
                if when == "teardown" and key == "stderr":
                    watch.add_text(text, "stderr")
            findings = watch.findings(f"the teardown of {item.name}")
            if findings:
                item.stash[QUIET_FINDINGS] = findings


def quiet_findings(item: pytest.Item) -> list[Any]:
    """The findings :class:`QuietTeardowns` left for ``item`` (taken: each is reported once)."""
    found = item.stash.get(QUIET_FINDINGS, None)
    if found:
        del item.stash[QUIET_FINDINGS]
        return list(found)
    return []
