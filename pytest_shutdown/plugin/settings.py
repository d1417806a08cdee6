"""The guard's settings: options and ini keys declared, read and validated; marker arguments.

A bad value is a :class:`pytest.UsageError` (exit code 4) at configure time naming the option
and the accepted values; the report and graphs paths are checked then too, creating nothing (a
refused run leaves no folder behind). A bad marker argument is a collection error naming the
test (:func:`validate_markers`, from ``pytest_generate_tests``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_shutdown._fast.lazy_dataclass import FrozenRecord, lazy_dataclass
from pytest_shutdown._fast.node_markers import CYCLES, marker_names
from pytest_shutdown.plugin.quiet import add_quiet_options
from pytest_shutdown.resources import allow_keys, kind_names

GUARD_MODES: tuple[str, ...] = ("off", "warn", "fail")
LONG_LIVED_CHOICES: tuple[str, ...] = ("list", "fail")
CONTAINMENT_CHOICES: tuple[str, ...] = ("marker", "subreaper")
#: Accepted values of ``--shutdown-platform``: ``auto`` and ``devices.PLATFORMS``, spelled out:
#: importing the device readers here would cost every session their import.
PLATFORM_CHOICES: tuple[str, ...] = ("auto", "cuda", "rocm", "cpu")
#: The plugin names that, given as ``-p NAME``, turn the guard on.
PLUGIN_NAMES: frozenset[str] = frozenset({"shutdown", "pytest_shutdown.plugin"})

DEFAULT_GRACE_S = 2.0
DEFAULT_BUDGET_S = 0.0
#: The largest budget or grace accepted (one day): well inside every platform's timers.
MAX_SECONDS = 86400.0

#: The keyword arguments ``allow_leaks`` accepts (each kind's ``allow_key``) at import.
ALLOW_LEAKS_KINDS: tuple[str, ...] = allow_keys()


class GuardSettings(FrozenRecord):
    """The validated settings of one run. ``budget_s == 0`` means no teardown budget."""

    __slots__ = (
        "mode", "grace_s", "budget_s", "report_path", "platform", "graphs_dir", "long_lived",
        "resources", "native_threads_allow", "containment",
    )
    mode: str
    grace_s: float
    budget_s: float
    report_path: Path | None
    platform: str
    graphs_dir: Path | None
    long_lived: str
    #: The resource kinds the guard checks (``--shutdown-resources``); None: all of them.
    resources: tuple[str, ...] | None
    #: Kernel-name globs of native threads never blamed, beyond the built-in list (ini
    #: ``shutdown_native_threads_allow``).
    native_threads_allow: tuple[str, ...]
    #: ``--shutdown-containment``: ``marker`` (the default) or ``subreaper``.
    containment: str

    def __init__(
        self,
        mode: str,
        grace_s: float,
        budget_s: float,
        report_path: Path | None,
        platform: str,
        graphs_dir: Path | None = None,
        long_lived: str = "list",
        resources: tuple[str, ...] | None = None,
        native_threads_allow: tuple[str, ...] = (),
        containment: str = "marker",
    ) -> None:
        super().__init__(
            mode, grace_s, budget_s, report_path, platform, graphs_dir, long_lived, resources,
            native_threads_allow, containment,
        )

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


#: Where the settings live: ``config.stash[SETTINGS_KEY]`` (the fixtures read the platform).
SETTINGS_KEY = pytest.StashKey[GuardSettings]()


def _seconds(value: object, source: str) -> float:
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0 or seconds > MAX_SECONDS:
        raise pytest.UsageError(
            f"{source}: {value!r} is not accepted; accepted: a number of seconds >= 0 and "
            f"<= {MAX_SECONDS:g}"
        )
    return seconds


def _choice(value: str, source: str, accepted: Sequence[str]) -> str:
    if value not in accepted:
        raise pytest.UsageError(
            f"{source}: {value!r} is not accepted; accepted: {', '.join(accepted)}"
        )
    return value


def _given(config: pytest.Config, name: str) -> tuple[object, str] | None:
    """The option ``--NAME`` (dashes), else the ini key ``name`` (stripped), with the source a
    message names; None when neither is given."""
    option = config.getoption(name, default=None)
    if option is not None:
        return option, "--" + name.replace("_", "-")
    ini = str(config.getini(name) or "").strip()
    return (ini, f"{name} (ini)") if ini else None


def guard_mode(config: pytest.Config) -> str:
    """Resolve the guard mode: ``--shutdown-guard``, else ini ``shutdown_guard``, else ``fail``
    when ``-p shutdown`` was given explicitly, else ``off``. ``--shutdown-guard=off`` wins."""
    given = _given(config, "shutdown_guard")
    if given is not None:
        return _choice(str(given[0]).strip(), given[1], GUARD_MODES)
    requested = config.getoption("plugins", default=None) or []
    return "fail" if any(str(name).strip() in PLUGIN_NAMES for name in requested) else "off"


def _option_or_ini(config: pytest.Config, name: str, default: float) -> float:
    given = _given(config, name)
    return default if given is None else _seconds(*given)


def load_settings(config: pytest.Config) -> GuardSettings:
    """Read and validate every option; raise :class:`pytest.UsageError` on the first bad one."""
    mode = guard_mode(config)
    grace = _option_or_ini(config, "shutdown_grace", DEFAULT_GRACE_S)
    budget = _option_or_ini(config, "shutdown_budget", DEFAULT_BUDGET_S)
    platform_option = config.getoption("shutdown_platform")
    platform = _choice(
        "auto" if platform_option is None else str(platform_option).strip(),
        "--shutdown-platform",
        PLATFORM_CHOICES,
    )
    report_path = _path_option(config, "shutdown_report", "--shutdown-report", "a file path")
    if report_path is not None:
        _check_report_path(report_path, str(config.getoption("shutdown_report")))
    graphs_dir = _path_option(config, "shutdown_graphs", "--shutdown-graphs", "a folder path")
    if graphs_dir is not None:
        _check_graphs_dir(graphs_dir, str(config.getoption("shutdown_graphs")))
    long_lived = _choice_of(config, "shutdown_long_lived", LONG_LIVED_CHOICES)
    resources = resource_kinds(config)
    lines = config.getini("shutdown_native_threads_allow") or ()
    native_allow = tuple(str(p).strip() for p in lines if str(p).strip())
    return GuardSettings(
        mode, grace, budget, report_path, platform, graphs_dir, long_lived, resources,
        native_allow, _choice_of(config, "shutdown_containment", CONTAINMENT_CHOICES),
    )


def resource_kinds(config: pytest.Config) -> tuple[str, ...] | None:
    """``--shutdown-resources``, else ini ``shutdown_resources``: a comma-separated list of
    resource kind names, or ``all`` (the default); None means all of them."""
    given = _given(config, "shutdown_resources") or ("", "")
    value, source = str(given[0]), given[1]
    names = [n.strip() for n in value.split(",") if n.strip()]
    accepted = f"accepted: a comma-separated list of {', '.join(kind_names())}, or all"
    if not names:
        if source.startswith("--"):  # an empty option is refused, an empty ini key is all
            raise pytest.UsageError(f"{source}: {value!r} is not accepted; {accepted}")
        return None
    if "all" in names:
        if len(names) > 1:
            raise pytest.UsageError(f"{source}: 'all' cannot be combined with kind names")
        return None
    unknown = [n for n in names if n not in kind_names()]
    if unknown:
        raise pytest.UsageError(
            f"{source}: unknown resource kind(s) {', '.join(map(repr, unknown))}; {accepted}"
        )
    return tuple(dict.fromkeys(names))


def _check_report_path(report_path: Path, given: str) -> None:
    """Refuse a report path that cannot or must not be written; create nothing."""
    from pytest_shutdown.plugin.records import (  # noqa: PLC0415 - with a report only
        RECORD_LOG_SUFFIX,
        is_record_log_name,
        record_log_path,
    )

    if is_record_log_name(report_path):
        raise pytest.UsageError(
            f"--shutdown-report: {given!r} is named as a record log is (*{RECORD_LOG_SUFFIX}): "
            "a report written there would replace the crash-safe record log of the run whose "
            "report is beside it; give the report another name, e.g. one ending in .json"
        )
    _refuse_long_names(report_path, "--shutdown-report")
    _refuse_long_names(record_log_path(report_path), "--shutdown-report", "its record log's")
    try:
        _refuse_special_targets(report_path, given)
        if report_path.is_dir():
            raise pytest.UsageError(
                f"--shutdown-report: {given!r} is a folder; expected a file path"
            )
        _writable_folder(report_path.parent, "--shutdown-report")
        if report_path.exists() and not os.access(report_path, os.W_OK):
            raise pytest.UsageError(f"--shutdown-report: {given!r} is read-only")
    except OSError as exc:
        raise pytest.UsageError(
            f"--shutdown-report: {given!r} cannot be checked ({exc.strerror or exc}); expected "
            "the path of a file in a folder you can write to"
        ) from None


def _check_graphs_dir(graphs_dir: Path, given: str) -> None:
    """Refuse a graphs folder that cannot or must not be written; create nothing."""
    from pytest_shutdown.plugin.records import refusal_of_target  # noqa: PLC0415 - with graphs only

    _refuse_long_names(graphs_dir, "--shutdown-graphs")
    try:
        refusal = refusal_of_target(graphs_dir)
        if refusal is not None and "kernel interface" in refusal:
            raise pytest.UsageError(f"--shutdown-graphs: {given!r} is refused: {refusal}")
        if graphs_dir.exists() and not graphs_dir.is_dir():
            raise pytest.UsageError(f"--shutdown-graphs: {given!r} exists and is not a folder")
        _writable_folder(graphs_dir, "--shutdown-graphs")
    except OSError as exc:
        raise pytest.UsageError(
            f"--shutdown-graphs: {given!r} cannot be checked ({exc.strerror or exc}); expected "
            "a folder you can write to"
        ) from None


#: A file name's limit in bytes where the file system does not say (NAME_MAX on Linux).
DEFAULT_NAME_MAX = 255


def _name_max(path: Path) -> int:
    """NAME_MAX of the file system holding ``path``'s nearest existing folder."""
    existing = next((p for p in path.parents if os.path.lexists(p)), None)
    try:
        limit = os.pathconf(existing or path.anchor or ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX, or the file system won't say
        return DEFAULT_NAME_MAX
    return limit if isinstance(limit, int) and limit > 0 else DEFAULT_NAME_MAX


def _refuse_long_names(path: Path, option: str, whose: str = "") -> None:
    """A name in ``path`` longer than NAME_MAX is a usage error now, not an OSError later."""
    limit = _name_max(path)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            shown = part if len(part) <= 40 else part[:40] + "..."
            what = f"{whose} name" if whose else "the name"
            raise pytest.UsageError(
                f"{option}: {what} {shown!r} is {size} bytes long; a file or folder name may "
                f"have at most {limit} bytes here (NAME_MAX); expected a shorter name"
            )


def _refuse_special_targets(report_path: Path, given: str) -> None:
    """Refuse a report or record log path that is not a regular file (or new) or is under /proc
    or /sys: special files are never replaced."""
    from pytest_shutdown.plugin.records import record_log_path, refusal_of_target  # noqa: PLC0415

    for target, what in (
        (report_path, "the report"),
        (record_log_path(report_path), "its record log"),
    ):
        if target.is_dir() and not target.is_symlink():
            continue  # "is a folder" has its own message
        refusal = refusal_of_target(target)
        if refusal is not None:
            shown = given if target == report_path else str(target)
            raise pytest.UsageError(
                f"--shutdown-report: {shown!r} ({what}) is refused: {refusal}; expected the "
                "path of a regular file, or a new one"
            )


def shows_details(config: pytest.Config) -> bool:
    """``--shutdown-details`` or ``-vv``: render every fact of each finding, not only its line."""
    return bool(config.getoption("shutdown_details", default=False)) or (
        config.get_verbosity() >= 2
    )


def _choice_of(config: pytest.Config, name: str, accepted: Sequence[str]) -> str:
    """:func:`_given`, validated against ``accepted``; else the first accepted value."""
    given = _given(config, name)
    return accepted[0] if given is None else _choice(str(given[0]).strip(), given[1], accepted)


def _path_option(config: pytest.Config, dest: str, option: str, what: str) -> Path | None:
    """A path option, relative to the invocation directory; an empty value is a UsageError."""
    value = config.getoption(dest, default=None)
    if value is None:
        return None
    if not str(value).strip():
        raise pytest.UsageError(f"{option}: expected {what}, got {str(value)!r}")
    path = Path(str(value)).expanduser()
    if not path.is_absolute():
        path = config.invocation_params.dir / path
    return path


def _writable_folder(folder: Path, option: str) -> None:
    """A UsageError unless ``folder`` can be written, or created (its nearest existing
    ancestor can be written); nothing is created here."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise pytest.UsageError(
            f"{option}: {str(existing)!r} is a file, not a folder; expected a path in a folder"
        )
    if existing is None or os.access(existing, os.W_OK | os.X_OK):
        return
    if existing == folder:
        raise pytest.UsageError(
            f"{option}: the folder {str(folder)!r} is read-only; expected a path in a folder "
            "you can write to"
        )
    raise pytest.UsageError(
        f"{option}: cannot create the folder {str(folder)!r} (Permission denied: "
        f"{str(existing)!r} is read-only); expected a path in a folder you can write to"
    )


def create_folder(folder: Path, option: str) -> None:
    """Create ``folder`` (and its parents) once every option is valid; a UsageError if that
    fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(
            f"{option}: cannot create the folder {str(folder)!r} ({exc.strerror or exc}); "
            "expected a path in a folder you can write to"
        ) from None


# Each help text is one paragraph: pytest --help keeps line breaks.
GUARD_DESC = """
The shutdown guard: 'fail' errors every test that leaves threads, child processes or a
gc.freeze() behind (and enforces the teardown budget), 'warn' emits ShutdownLeakWarning instead,
'off' checks nothing. Default: 'fail' when the plugin is requested with '-p shutdown', otherwise
'off'. '--shutdown-guard=off' wins over '-p shutdown' and the ini key.
""".strip().replace("\n", " ")
GRACE_DESC = f"""
Seconds a thread or child process started by a test may keep running after the test's teardown
before it is reported as a leak (polled, so clean tests do not wait). Default {DEFAULT_GRACE_S:g}.
""".strip().replace("\n", " ")
BUDGET_DESC = """
Teardown budget in seconds (0 to 86400): a test's teardown (fixture finalizers included) that
takes longer is interrupted, every thread's stack is captured in the test's report section, the
test's child processes are killed and the test errors; the session goes on. A teardown still not
done one more budget later ends the process with exit code 70 (stacks dumped, report written).
0 (the default) means no budget. A per-test value is set with @pytest.mark.shutdown_budget(seconds).
""".strip().replace("\n", " ")
REPORT_DESC = """
Write the guard's findings and shutdown durations as JSON to this path (merged over xdist
workers). Each test's record is appended to PATH's record log (<stem>.records.jsonl) as the
test ends; after a killed run, 'python -m pytest_shutdown.plugin.records LOG -o PATH' assembles it.
""".strip().replace("\n", " ")
GRAPHS_DESC = """
Draw a backref picture (objgraph.show_backrefs) into this folder for every not-collected and
finalizer-* finding of assert_finalizes_on_gc: a PNG when graphviz's 'dot' is on PATH, else the
.dot source and a note. The terminal section 'shutdown graphs' names the files.
""".strip().replace("\n", " ")
GPU_PER_WORKER_DESC = """
Under pytest-xdist, give each worker one GPU: worker gwN sees the (N mod count)-th visible device
through CUDA_VISIBLE_DEVICES (CUDA) or HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (ROCm), set
before the conftests are imported, so engine fixtures fan out over a multi-GPU machine. The
header says when workers share GPUs. Does nothing without xdist or on the CPU.
""".strip().replace("\n", " ")
CONTAINMENT_DESC = """
How processes that leave a test's tree (a daemon's double fork, a shell's background job) are
found. 'marker' (default): by the session marker in their environment; nothing changes for the
test (they are re-parented to PID 1 as without the plugin). 'subreaper': pytest becomes a child
subreaper and adopts them (also finds processes forked without exec), but a test then sees
orphans as pytest's children; adopted zombies are reaped at each check.
""".strip().replace("\n", " ")

LONG_LIVED_DESC = """
Threads and child processes owned by a module global or a class attribute (a singleton pool)
are never a test's leak; the guard lists those still alive at session end under 'long-lived
resources'. 'list' (default) only lists them; 'fail' also makes the session fail.
""".strip().replace("\n", " ")
RESOURCES_DESC = f"""
Which resource kinds the guard checks after each test: a comma-separated list of
{', '.join(kind_names())}, or 'all' (the default).
""".strip().replace("\n", " ")
NATIVE_ALLOW_DESC = """
Kernel-name glob patterns (one a line) of native threads (not listed by threading) that the
guard never blames: lazily started process-lifetime pools of your libraries, beyond the built-in
list (OpenMP/MKL/torch intra-op, gRPC, CUDA, NVML, tokio, rayon...).
""".strip().replace("\n", " ")
PLATFORM_DESC = """
Device platform for the pytest-shutdown fixtures: 'auto' (default) detects it; 'cuda', 'rocm'
or 'cpu' forces one.
""".strip().replace("\n", " ")

DETAILS_DESC = """
Show every fact of each finding (its JSON details: stacks, pids, command lines, the cell) in the
failure and in the terminal section 'shutdown'; -vv does the same.
""".strip().replace("\n", " ")


#: The options in --help order: ``--shutdown-NAME`` (dest ``shutdown_NAME``), metavar, help; a
#: metavar of None is a flag.
_OPTIONS: tuple[tuple[str, str | None, str], ...] = (
    ("guard", "|".join(GUARD_MODES), GUARD_DESC),
    ("grace", "SECONDS", GRACE_DESC),
    ("budget", "SECONDS", BUDGET_DESC),
    ("report", "PATH", REPORT_DESC),
    ("graphs", "DIR", GRAPHS_DESC),
    ("platform", "|".join(PLATFORM_CHOICES), PLATFORM_DESC),
    ("gpu-per-worker", None, GPU_PER_WORKER_DESC),
    ("long-lived", "|".join(LONG_LIVED_CHOICES), LONG_LIVED_DESC),
    ("containment", "|".join(CONTAINMENT_CHOICES), CONTAINMENT_DESC),
    ("details", None, DETAILS_DESC),
    ("resources", "KIND,...|all", RESOURCES_DESC),
)


def add_options(parser: pytest.Parser) -> None:
    """The options and ini keys of the plugin (its ``pytest_addoption``)."""
    group = parser.getgroup("shutdown", "pytest-shutdown: leaks, frozen GC and hung teardowns")
    for name, metavar, help_text in _OPTIONS:
        dest = "shutdown_" + name.replace("-", "_")
        kind: dict[str, object] = (
            {"action": "store_true", "default": False}
            if metavar is None
            else {"metavar": metavar, "default": None}
        )
        group.addoption(f"--shutdown-{name}", dest=dest, help=help_text, **kind)
    parser.addini("shutdown_guard", GUARD_DESC, default="")
    parser.addini("shutdown_resources", RESOURCES_DESC, default="")
    parser.addini("shutdown_native_threads_allow", NATIVE_ALLOW_DESC, type="linelist", default=[])
    parser.addini("shutdown_long_lived", LONG_LIVED_DESC, default="")
    parser.addini("shutdown_containment", CONTAINMENT_DESC, default="")
    parser.addini("shutdown_grace", GRACE_DESC, default="")
    parser.addini("shutdown_budget", BUDGET_DESC, default="")
    add_quiet_options(parser)  # --shutdown-quiet (pytest_shutdown.plugin.quiet)


@lazy_dataclass(frozen=True)
class AllowLeaks:
    """What ``@pytest.mark.allow_leaks`` permits one test to leave behind.

    ``threads`` is True (any thread), False, or thread-name glob patterns; ``others`` holds the
    other kinds' keywords (``allow_key`` of each resource kind) given a true value.
    """

    threads: bool | tuple[str, ...]
    processes: bool
    gc_freeze: bool
    reason: str
    others: frozenset[str] = frozenset()

    def allowance(self, key: str) -> bool | tuple[str, ...] | None:
        """What the marker allows for the kind whose ``allow_key`` is ``key``: True (all),
        glob patterns, or None (nothing)."""
        value: object = {
            "threads": self.threads,
            "processes": self.processes,
            "gc_freeze": self.gc_freeze,
        }.get(key, key in self.others)
        if value is True or isinstance(value, tuple):
            return value  # type: ignore[return-value]
        return None


#: The markers of this plugin whose arguments ``validate_markers`` checks.
GUARD_MARKERS = frozenset(
    {"allow_leaks", "shutdown_budget", "expect_force_kill", "shutdown_cycles"}
)


def allow_leaks_of(item: pytest.Item) -> AllowLeaks | None:
    """Parse the closest ``allow_leaks`` marker of ``item``; a bad one is a UsageError.

    ``allow_leaks(reason=...)`` alone allows every kind; with any kind's keyword given (see
    :data:`ALLOW_LEAKS_KINDS`), only the kinds given a true value are allowed. ``threads`` may
    also be a list of thread-name glob patterns.
    """
    marker = item.get_closest_marker("allow_leaks")
    if marker is None:
        return None
    keys = allow_keys()
    where = f"{item.nodeid}: @pytest.mark.allow_leaks"
    accepted = f"accepted: {', '.join(keys)}, reason"
    if marker.args:
        raise pytest.UsageError(f"{where} takes keyword arguments only; {accepted}")
    unknown = sorted(set(marker.kwargs) - {*keys, "reason"})
    if unknown:
        raise pytest.UsageError(f"{where}: unknown argument(s) {', '.join(unknown)}; {accepted}")
    reason = marker.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(f"{where} needs reason='why these leaks are expected'")
    given = {kind: marker.kwargs[kind] for kind in keys if kind in marker.kwargs}
    if not given:
        return AllowLeaks(True, True, True, reason, frozenset(keys))
    threads = given.get("threads", False)
    if isinstance(threads, (list, tuple)):
        if not all(isinstance(p, str) for p in threads):
            raise pytest.UsageError(
                f"{where}: threads= takes True/False or thread-name glob patterns (strings)"
            )
        threads = tuple(threads)
    elif not isinstance(threads, bool):
        raise pytest.UsageError(
            f"{where}: threads= takes True/False or thread-name glob patterns, got {threads!r}"
        )
    for kind in keys:
        if kind != "threads" and not isinstance(given.get(kind, False), bool):
            raise pytest.UsageError(f"{where}: {kind}= takes True or False, got {given[kind]!r}")
    others = frozenset(k for k, v in given.items() if k != "threads" and v is True)
    return AllowLeaks(threads, "processes" in others, "gc_freeze" in others, reason, others)


def expect_force_kill_of(item: pytest.Item) -> bool:
    """Whether ``item`` carries ``expect_force_kill(reason=...)``; bad arguments raise a
    UsageError (reason is optional, a string; nothing else is accepted)."""
    marker = item.get_closest_marker("expect_force_kill")
    if marker is None:
        return False
    where = f"{item.nodeid}: @pytest.mark.expect_force_kill"
    if marker.args:
        raise pytest.UsageError(f"{where} takes keyword arguments only; accepted: reason")
    unknown = sorted(set(marker.kwargs) - {"reason"})
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown argument(s) {', '.join(unknown)}; accepted: reason"
        )
    if not isinstance(marker.kwargs.get("reason", ""), str):
        raise pytest.UsageError(f"{where}: reason= takes a string")
    return True


def validate_markers(item: pytest.Item) -> None:
    """Check the arguments of every marker of this plugin on ``item``; raise UsageError."""
    if not marker_names(item) & GUARD_MARKERS:
        return
    allow_leaks_of(item)
    budget_of(item, DEFAULT_BUDGET_S)
    expect_force_kill_of(item)
    if CYCLES in marker_names(item):
        from pytest_shutdown.plugin.cycles import cycles_of  # noqa: PLC0415 - only where it is used

        cycles_of(item)


def budget_of(item: pytest.Item, default: float) -> float:
    """The teardown budget of ``item``: its ``shutdown_budget(seconds)`` marker, else
    ``default``; a bad marker is a UsageError."""
    marker = item.get_closest_marker("shutdown_budget")
    if marker is None:
        return default
    where = f"{item.nodeid}: @pytest.mark.shutdown_budget"
    args = list(marker.args)
    unknown = sorted(set(marker.kwargs) - {"seconds"})
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown argument(s) {', '.join(unknown)}; accepted: seconds"
        )
    if "seconds" in marker.kwargs:
        args.append(marker.kwargs["seconds"])
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], (int, float)):
        raise pytest.UsageError(
            f"{where} takes one number of seconds >= 0 (0 = no budget), got {marker.args!r}"
        )
    return _seconds(args[0], where)
