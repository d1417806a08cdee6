"""Real test suites plain and under the guard (warn and fail): time ratios, outcomes, findings.

Not part of ``make test``. The suites are subsets of projects' own test suites, pinned to one
release each: issue 26's four (pebble, loky, tqdm, joblib; the default, and the guard budget's)
and issue 44's, whose tests start processes and signal them (execnet, pexpect, sh; run them with
``--suites execnet,pexpect,sh``; psutil, trio, pytest-xprocess: parentage, zombies, pidfds,
signal handlers, process trees; uvicorn, billiard: supervisors, reloaders and pools that signal,
restart and time out their workers); issue 48's, whose tests run asyncio loops, tasks and
executors and pyzmq sockets (pyzmq, asgiref, janus, anyio;
``--suites pyzmq,asgiref,janus,anyio``). Each sdist is downloaded from PyPI
(``pip download --no-binary``) and unpacked into a side folder this script manages
(``.venv-third-party/`` in the repository, git-ignored), with a side venv holding pytest, the
suites' test dependencies and this checkout of pytest-shutdown (editable). ``--setup-only``
builds it; every run builds what is missing.

Each suite runs plain (``-p no:shutdown``), guarded in warn mode and guarded in fail mode
(``-p shutdown --shutdown-guard=warn|fail``), the order turning each round, with bytecode
caching on and the same interpreter flags in every mode, each writing ``--junitxml``. Per suite
it prints the wall and CPU times, the ratios guarded/plain (median of the rounds; target <=
1.05), every test whose outcome differs between the modes of one round (the target is none),
and the guard's findings. The findings come from the junit XML too (the guard adds a
``shutdown:CODE`` property to each test it finds something on), not from the JSON report: the
report (``--shutdown-report``) is an opt-in output that a guarded session does not write by
default, and its record log (a line per test) would be timed as the guard's. Every run has a
deadline; a run past it is SIGKILLed with its whole process group and counted as ``timeout``.

    .venv/bin/python benchmarks/third_party.py [--suites tqdm,joblib] [--rounds 3] [--json P]
    .venv/bin/python benchmarks/third_party.py --suites execnet,pexpect,sh --rounds 1
    .venv/bin/python benchmarks/third_party.py --suites psutil,trio,pytest-xprocess --rounds 1
    .venv/bin/python benchmarks/third_party.py --suites uvicorn,billiard --rounds 1
    .venv/bin/python benchmarks/third_party.py --suites pyzmq,asgiref,janus,anyio --rounds 1
    .venv/bin/python benchmarks/third_party.py --setup-only
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from figures import Figure, report
from runs import bytecode_env, load_average, run_command

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SIDE = ROOT / ".venv-third-party"
RATIO_LIMIT = 1.05
#: The junit property the guard adds to a test per finding (``item.user_properties``).
FINDING_PROPERTY = "shutdown:"
MODES = ("plain", "warn", "fail")
SETUP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Suite:
    """A pinned release's test subset: what to run, with which arguments and deadline."""

    name: str
    version: str
    targets: tuple[str, ...]
    args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    why: str = ""
    #: A suite whose run takes tens of seconds (its tests wait out timeouts): fewer rounds.
    slow: bool = False
    #: The interpreter's own flags, before ``-m pytest`` (``-P``: an sdist whose package folder
    #: needs building must not shadow the installed wheel from the working directory).
    python_flags: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.version}"


#: The guard budget's suites (issue 26): run by default, and by ``guard_budget.py``.
SUITES = {
    suite.name: suite
    for suite in (
        Suite(
            "pebble",
            "5.2.3",
            ("test/test_process_pool_fork.py",),
            why="process pools under fork: terminate, timeouts, crashed workers",
            slow=True,
        ),
        Suite(
            "loky",
            "3.7.0",
            ("tests/test_loky_module.py", "tests/test_worker_timeout.py"),
            ("--skip-high-memory",),
            why="the reusable executor singleton, worker timeouts, cpu_count",
        ),
        Suite(
            "tqdm",
            "4.70.1",
            (
                "tests/tests_synchronisation.py",
                "tests/tests_concurrent.py",
                "tests/tests_contrib.py",
                "tests/tests_rlock.py",
                "tests/tests_utils.py",
                "tests/tests_tqdm.py",
                "tests/tests_itertools.py",
                "tests/tests_asyncio.py",
                "tests/tests_main.py",
            ),
            why="monitor thread, Pool.imap (test_imap), thread/process maps; -W error",
        ),
        Suite(
            "joblib",
            "1.6.0",
            ("joblib/test/test_memmapping.py", "joblib/test/test_parallel.py"),
            (
                "-k",
                "((multiprocessing and pool) or timeout or abort_backend) "
                "and not threading and not backend5",
                "--color=no",
            ),
            why="MemmappingPool (multiprocessing.Pool) terminate, Parallel timeouts and aborts "
            "(not the threading backend's: its aborted tasks keep sleeping in the pool's threads "
            "for 10 s after the test, a real thread-leak that fail mode turns into an error)",
        ),
    )
}
#: Suites whose tests start processes and signal them (issue 44): run when named (``--suites``),
#: for their outcomes plain, warn and fail; not in the guard budget's figures.
PROCESS_SUITES = {
    suite.name: suite
    for suite in (
        Suite(
            "execnet",
            "2.1.2",
            (
                "testing/test_termination.py",
                "testing/test_multi.py",
                "testing/test_threadpool.py",
                "testing/test_gateway.py",
            ),
            (
                "-o",
                "pythonpath=src",
                # Fails plain too: the parametrized copies import one module name ("remote")
                # from each test's own tmp_path, the first copy's module cached in sys.modules.
                "-k",
                "not test_remote_exec_module_is_removed",
            ),
            why="popen/socket/proxy gateways (child interpreters): termination, trykill on "
            "SIGTERM/SIGKILL, group safe_terminate, the execution model's thread pool",
        ),
        Suite(
            "pexpect",
            "4.9.0",
            (
                "tests/test_isalive.py",
                "tests/test_misc.py",
                "tests/test_destructor.py",
                "tests/test_popen_spawn.py",
                "tests/test_interact.py",
                "tests/test_constructor.py",
                "tests/test_env.py",
                "tests/test_winsize.py",
                "tests/test_async.py",
            ),
            why="children on a pty (ptyprocess fork): SIGHUP/SIGINT/SIGKILL, isalive/wait, "
            "terminate, spawns dropped to the garbage collector (test_destructor), asyncio",
            slow=True,
        ),
        Suite(
            "sh",
            "2.4.0",
            ("tests/sh_test.py",),
            (
                # No pytest section of its own: without -c, pytest would take this repository's
                # pyproject.toml above the side folder as the ini and the rootdir.
                "-c",
                "tox.ini",
                "-o",
                "pythonpath=src",
                "-k",
                "(signal or sig or kill or terminate or timeout or session or group or bg "
                "or background or wait or done or exit or process) and not piped "
                "and not multiple_pipes",
            ),
            why="background commands and their threads, signals to children and their "
            "process groups, new sessions, timeouts that kill, done callbacks, SIGHUP to "
            "grandchildren",
            slow=True,
        ),
        Suite(
            "psutil",
            "7.2.2",  # the side venv's psutil (this venv's): its tests import the wheel
            (
                "tests/test_process.py",
                "tests/test_testutils.py",
                "tests/test_misc.py",
                "tests/test_system.py::TestProcessIter",
                "tests/test_system.py::TestProcessAPIs",
                "tests/test_connections.py",
            ),
            (
                # Its addopts load instafail and xdist and turn junitxml off.
                "-o",
                "addopts=",
                "-o",
                "verbosity_subtests=0",  # its ini's "0" (a string) is an error to pytest 9.2
                # The sdist's psutil/ (unbuilt) must not shadow the wheel: tests/ is a package,
                # so prepend mode would put the sdist's root first on sys.path.
                "--import-mode=append",
                # Fails plain too: its children put the sdist's root first on sys.path and
                # import the unbuilt psutil from there.
                "-k",
                "not test_multi_sockets_procs",
            ),
            why="children and parents (ppid, children(recursive=True)), zombies, wait() and "
            "wait_procs, send_signal/terminate/kill, reap_children of its helpers' process "
            "trees, its SIGTERM handler set at import; the process's own sockets (every "
            "test_connections test asserts it has none before and after)",
            slow=True,
            python_flags=("-P",),
        ),
        Suite(
            "trio",
            "0.35.0",
            (
                "src/trio/_tests/test_subprocess.py",
                "src/trio/_tests/test_signals.py",
                "src/trio/_core/_tests/test_ki.py",
                "src/trio/_core/_tests/test_run.py",
                "src/trio/_tests/test_threads.py",
                "src/trio/_core/_tests/test_thread_cache.py",
                "src/trio/_tests/test_unix_pipes.py",
            ),
            (
                "-o",
                "pythonpath=src",
                "--run-slow",
                # Its own plugin runs the async tests; pytest-asyncio's configure-time
                # deprecation warning is an error under its filterwarnings.
                "-p",
                "no:asyncio",
            ),
            # Runs in about 9 s. Started with SIGINT ignored (this script run as a background
            # job of a non-interactive shell, ``cmd &``), its KeyboardInterrupt tests fail or
            # spin in every mode: run it in the foreground, or with SIGINT at its default.
            timeout_s=180.0,
            why="subprocesses waited with pidfds, open_signal_receiver, KeyboardInterrupt "
            "delivery (its SIGINT handler set and put back per run), the run loop's system "
            "tasks, to_thread/from_thread and the thread cache's workers, pipes; -W error",
        ),
        Suite(
            "pytest-xprocess",
            "1.0.2",
            ("tests",),
            (
                # Its fixture keeps its processes' pid files under config.cache.
                "-p",
                "cacheprovider",
                # Turned back on after -p no:cacheprovider: already imported, not rewritten.
                "-W",
                "ignore::pytest.PytestAssertRewriteWarning",
                "-p",
                "no:asyncio",  # its configure-time warning is an error under -W error
            ),
            why="a pytest plugin that starts server processes and terminates their trees "
            "(psutil), across in-process and subprocess pytest runs, on interruption too",
            slow=True,
        ),
        Suite(
            "uvicorn",
            "0.55.0",
            (
                "tests/supervisors",
                "tests/test_server.py",
                "tests/test_subprocess.py",
            ),
            (
                "-o",
                "addopts=",  # its addopts say -n 8 (xdist)
                "-p",
                "no:asyncio",  # its async tests run on anyio's plugin; -W error
            ),
            why="the multiprocess supervisor (workers spawned, restarted, killed; SIGINT, "
            "SIGTERM, SIGHUP, SIGTTIN/SIGTTOU to the supervisor), the reload supervisors "
            "(stat and watchfiles), servers in threads with their signal handlers captured and "
            "re-raised, spawn subprocesses; -W error",
        ),
        Suite(
            "billiard",
            "4.3.2",
            # Not t/integration: Python 2 code (import Queue, StringIO), fails to collect.
            ("t/unit",),
            why="celery's fork of multiprocessing: its Pool (a copy of multiprocessing's code, "
            "no subclass) terminated, closed and joined, hard timeouts, workers terminated "
            "mid-job, SystemExit in a task, pools left running; spawn/fork/forkserver "
            "contexts (its semaphore tracker and fork server keep no pid), set_pdeathsig",
        ),
    )
}
#: Suites whose tests run asyncio loops, tasks, executors and pyzmq sockets (issue 48's
#: ``asyncio`` and ``zmq`` kinds wrap their methods): run when named, like the process suites.
ASYNC_SUITES = {
    suite.name: suite
    for suite in (
        Suite(
            "pyzmq",
            "27.3.0",
            tuple(
                f"tests/test_{name}.py"
                for name in (
                    "socket", "context", "asyncio", "future", "poll", "monitor", "pubsub",
                    "reqrep", "pair", "multipart", "device", "proxy_steerable", "monqueue",
                    "retry_eintr", "message", "etc",
                )
            ),  # fmt: skip
            (
                # test_large_send sends 2 GiB (20 s of copying): the socket code it runs is the
                # other tests' too.
                "-m",
                "not large",
                # Flaky in every mode (upstream marks it so): zmq_poll keeps the clock as whole
                # seconds (a C int), so a SIGALRM whose poll straddles a second's turn leaves the
                # retried poll no time; about one run in ten (docs/benchmarks.md).
                "-k",
                "not test_retry_poll",
            ),
            why="sockets bound, connected, closed with and without linger, Context.term() and "
            "destroy() (in a thread of the suite's own with a deadline), zmq.asyncio and "
            "Future sockets on pytest-asyncio loops, pollers, monitors, devices in threads",
            # The zmq/ of the sdist is the unbuilt source: the tests must import the wheel.
            python_flags=("-P",),
        ),
        Suite(
            "asgiref",
            "3.13.0",
            ("tests",),
            ("--ignore", "tests/test_benchmark_local.py"),  # needs pytest-benchmark
            why="async_to_sync (a new loop in an executor thread per call), sync_to_async's "
            "thread-sensitive executors, CurrentThreadExecutor, Local across threads and tasks, "
            "timeouts that cancel tasks, the ASGI test server (tasks left to the loop fixture)",
        ),
        Suite(
            "janus",
            "2.0.0",
            ("tests/test_async.py", "tests/test_mixed.py", "tests/test_sync.py"),
            ("-o", "addopts="),  # its addopts need pytest-cov
            why="a queue between threads and a loop: call_soon_threadsafe from executor "
            "threads, loops closed in tests, unfinished-task waits; -W error",
        ),
        Suite(
            "anyio",
            "4.16.0",
            tuple(
                f"tests/test_{name}.py"
                for name in (
                    "taskgroups", "to_thread", "from_thread", "synchronization", "debugging",
                    "eventloop", "lowlevel", "contextmanagers",
                )
            ),  # fmt: skip
            (
                "-k",
                # The trio backend's copies (trio is not installed: they skip). And
                # test_single_thread, flaky plain (2 of 4 plain runs failed): it compares
                # threading.active_count() at once after its portals' threads were told to end.
                "not trio and not (TestBlockingPortalProvider and test_single_thread "
                "and not test_single_thread_overlapping)",
            ),
            why="its own pytest plugin's runner (asyncio in debug mode), task groups and "
            "cancel scopes, worker threads (to_thread) and calls back into the loop "
            "(from_thread, BlockingPortal), tasks' names and coroutines; -W error",
        ),
    )
}
ALL_SUITES = {**SUITES, **PROCESS_SUITES, **ASYNC_SUITES}

#: The side venv's packages: pytest and psutil as in this venv; the suites' test dependencies.
SIDE_PACKAGES = (
    "pytest-timeout==2.4.0",  # tqdm's ini sets timeout = 30
    "pytest-asyncio==1.5.0",  # tqdm's addopts say --asyncio-mode=strict
    "cloudpickle==3.1.3",  # loky
    "numpy==2.4.6",  # joblib's memmapping tests
    "ptyprocess==0.7.0",  # pexpect
    "pyzmq==27.3.0",  # pyzmq's own tests import the wheel
    "anyio==4.16.0",  # anyio's own tests import the wheel (and its pytest plugin)
    "pytest-mock==3.17.0",  # anyio
    "trustme==1.2.1",  # anyio's conftest
    "trio==0.35.0",  # trio's addopts load its pytest plugin from the installed package
    "pytest-xprocess==1.0.2",  # its tests' pytester subprocesses load it as an entry point
    "uvicorn==0.55.0",  # uvicorn's dependencies (click, h11)
    "httpx2==2.17.0",  # uvicorn's tests' client
    "watchfiles==1.3.0",  # uvicorn's WatchFilesReload tests
    "httptools==0.9.0",  # uvicorn's test_server imports its httptools protocol
    "billiard==4.3.2",  # billiard's tests import the sdist's (pure Python): same release
)


# --- the side folder ---------------------------------------------------------------------------


def side_python(side: Path) -> Path:
    return side / "venv" / "bin" / "python"


def setup(side: Path, suites: Sequence[Suite]) -> None:
    """Build what is missing: the side venv (pytest, dependencies, this checkout) and the
    unpacked sdists of ``suites``."""
    side.mkdir(parents=True, exist_ok=True)
    python = side_python(side)
    stamp = side / "venv" / "installed.json"
    wanted = {
        "packages": [*_pinned("pytest", "psutil"), *SIDE_PACKAGES],
        "project": str(ROOT),
    }
    if not python.exists():
        _setup_step([sys.executable, "-m", "venv", str(side / "venv")], "creating the side venv")
    if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
        _setup_step(
            [str(python), "-m", "pip", "install", "-q", *wanted["packages"]],
            "installing pytest and the suites' test dependencies",
        )
        _setup_step(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
            "installing this checkout of pytest-shutdown (editable)",
        )
        stamp.write_text(json.dumps(wanted))
    for suite in suites:
        if (side / "src" / suite.folder).is_dir():
            continue
        sdists = side / "sdists"
        _setup_step(
            [
                str(python), "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                "-d", str(sdists), f"{suite.name}=={suite.version}",
            ],
            f"downloading the {suite.folder} sdist",
        )
        archive = next(sdists.glob(f"{suite.name}-{suite.version}.tar.gz"), None) or next(
            sdists.glob(f"{suite.name.lower()}-{suite.version}.tar.gz")
        )
        with tarfile.open(archive) as tar:
            tar.extractall(side / "src", filter="data")


def _pinned(*names: str) -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in names]


def _setup_step(command: list[str], what: str) -> None:
    print(f"setup: {what}", flush=True)
    try:
        subprocess.run(command, check=True, timeout=SETUP_TIMEOUT_S)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise SystemExit(f"setup failed while {what}: {exc}") from None


# --- one run -----------------------------------------------------------------------------------


@dataclass
class Result:
    """One run of one suite in one mode."""

    mode: str
    wall_s: float
    cpu_s: float
    summary: str
    outcomes: dict[str, str]
    findings: dict[str, int] = field(default_factory=dict)
    flagged: list[tuple[str, list[str]]] = field(default_factory=list)
    left_behind: bool = False


def run_suite(side: Path, suite: Suite, mode: str, extra: Sequence[str]) -> Result:
    """One run of ``suite`` in ``mode`` (plain, warn, fail), its deadline enforced."""
    work = Path(tempfile.mkdtemp(prefix=f"third-party-{suite.name}-{mode}-"))
    junit = work / "junit.xml"
    if mode == "plain":
        mode_args = ["-p", "no:shutdown"]
    else:
        mode_args = ["-p", "shutdown", f"--shutdown-guard={mode}"]
    command = [
        str(side_python(side)), *suite.python_flags, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        *mode_args, f"--junitxml={junit}", "-o", "junit_family=xunit2",
        *suite.args, *extra, *suite.targets,
    ]
    env = bytecode_env(side / "pycache")
    done = run_command(
        command, cwd=side / "src" / suite.folder, env=env, timeout_s=suite.timeout_s
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("=") or " in " in line]
    summary = lines[-1].strip("= ") if lines else f"exit {done.returncode}"
    if done.timed_out:
        summary = f"timeout after {suite.timeout_s:.0f} s"
    outcomes, flagged = junit_outcomes(junit) if junit.exists() else ({}, [])
    if done.returncode not in (0, 1, 5) or done.timed_out:
        (work / "output.txt").write_text(done.stdout + done.stderr)
        summary += f" (exit {done.returncode}; output: {work / 'output.txt'})"
    result = Result(mode, done.wall_s, done.cpu_s, summary, outcomes, left_behind=done.left_behind)
    if mode != "plain":
        result.flagged = flagged
        result.findings = dict(Counter(code for _, codes in flagged for code in codes))
    if not (work / "output.txt").exists():  # kept only where a run failed, to read
        shutil.rmtree(work, ignore_errors=True)
    return result


def junit_outcomes(path: Path) -> tuple[dict[str, str], list[tuple[str, list[str]]]]:
    """Test id -> passed / failed / error / skipped (joined with ``+`` when a test has several,
    e.g. failed in call and errored in teardown); and (test id, the guard's finding codes) of
    each test with findings (its ``shutdown:CODE`` properties)."""
    outcomes: dict[str, str] = {}
    flagged: list[tuple[str, list[str]]] = []
    try:
        tree = ET.parse(path)
    except ET.ParseError:
        return outcomes, flagged
    for case in tree.iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = sorted({child.tag for child in case} & {"failure", "error", "skipped"})
        outcome = "+".join("failed" if k == "failure" else k for k in kinds) or "passed"
        outcomes[key] = outcome if key not in outcomes else f"{outcomes[key]}+{outcome}"
        codes = [
            name.removeprefix(FINDING_PROPERTY)
            for prop in case.iter("property")
            if (name := prop.get("name", "")).startswith(FINDING_PROPERTY)
        ]
        if codes:
            flagged.append((key, codes))
    return outcomes, flagged


# --- a suite over its rounds ---------------------------------------------------------------------


def measure_suite(
    side: Path, suite: Suite, rounds: int, extra: Sequence[str]
) -> tuple[list[Figure], list[tuple[str, str]]]:
    """The suite's figures and the outcome differences found: (test id, line)."""
    load = load_average()
    print(f"--- {suite.folder}: {suite.why} (load {load})", flush=True)
    for mode in ("plain", "fail"):  # warm-up: bytecode of the suite and the plugin, page cache
        run_suite(side, suite, mode, [*extra, "--collect-only"])
    results: dict[str, list[Result]] = {mode: [] for mode in MODES}
    differences: list[tuple[str, str]] = []
    flagged: Counter[tuple[str, str]] = Counter()
    for round_no in range(rounds):
        order = MODES[round_no % 3 :] + MODES[: round_no % 3]
        this_round = {}
        for mode in order:
            result = run_suite(side, suite, mode, extra)
            this_round[mode] = result
            results[mode].append(result)
            for nodeid, codes in result.flagged:
                for code in set(codes):  # a round counts once, whatever its findings of a code
                    flagged[(f"{mode}: {nodeid}", code)] += 1
            print(
                f"  round {round_no + 1} {mode:<5} {result.wall_s:7.1f} s wall "
                f"{result.cpu_s:7.1f} s CPU  {result.summary}"
                + (f"; findings {result.findings}" if result.findings else "")
                + ("; LEFT PROCESSES BEHIND (killed)" if result.left_behind else ""),
                flush=True,
            )
        differences += outcome_differences(this_round, round_no + 1)
    load_after = load_average()
    for _, line in differences:
        print(f"  DIFFERENT OUTCOME: {line}")
    for mode in ("warn", "fail"):
        print(f"  {pair_summary(results, mode)}", flush=True)
    for (where, code), count in sorted(flagged.items()):
        print(f"  finding: {where} [{code}] in {count} of {rounds} rounds")
    figures = []
    note = f"load {load} .. {load_after}"
    plain_walls = [r.wall_s for r in results["plain"]]
    if len(plain_walls) > 1:
        spread = max(plain_walls) / min(plain_walls) - 1.0
        print(
            f"  plain's own spread: {min(plain_walls):.1f}-{max(plain_walls):.1f} s "
            f"({spread:.0%}), the noise each round's ratio sits in",
            flush=True,
        )
        note += f"; plain's spread {spread:.0%}"
    for mode in ("warn", "fail"):
        for metric, label in (("wall_s", ""), ("cpu_s", ", CPU")):
            ratios = [
                getattr(g, metric) / getattr(p, metric)
                for g, p in zip(results[mode], results["plain"], strict=True)
            ]
            plain = statistics.median(getattr(r, metric) for r in results["plain"])
            guarded = statistics.median(getattr(r, metric) for r in results[mode])
            figures.append(
                Figure(
                    f"{suite.name} {suite.version} {mode}/plain{label}",
                    statistics.median(ratios),
                    "x",
                    limit=RATIO_LIMIT,
                    note=f"plain {plain:.1f} s, {mode} {guarded:.1f} s; rounds "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}; {note}",
                )
            )
    figures.append(
        Figure(
            f"{suite.name} {suite.version} tests whose outcome differs by mode",
            float(len({name for name, _ in differences})),
            "tests",
            limit=0.0,
            note=results["plain"][-1].summary,
        )
    )
    return figures, differences


def pair_summary(results: dict[str, list[Result]], mode: str) -> str:
    """``plain vs MODE``: how many tests' outcomes differ in any round, and how many of those
    are a fail-mode error on a test the guard has findings on (a leak it reports)."""
    differ: set[str] = set()
    explained: set[str] = set()
    for plain, guarded in zip(results["plain"], results[mode], strict=True):
        flagged = dict(guarded.flagged)
        for name in set(plain.outcomes) | set(guarded.outcomes):
            before = plain.outcomes.get(name, "missing")
            after = guarded.outcomes.get(name, "missing")
            if before == after:
                continue
            differ.add(name)
            if mode == "fail" and "error" in after and name in flagged:
                explained.add(name)
    tests = len(results["plain"][-1].outcomes)
    line = f"plain vs {mode}: {len(differ)} of {tests} tests' outcomes differ"
    if explained:
        line += f" ({len(explained)} a fail-mode error with the guard's findings"
        line += f", {len(differ - explained)} not)"
    return line


def outcome_differences(results: dict[str, Result], round_no: int) -> list[tuple[str, str]]:
    """(test id, ``round N: test id: plain X, warn Y, fail Z``) per test whose outcome differs
    for no reason the guard gives: a test that errors in fail mode only, with the guard's
    findings in that run (a real leak), is listed as explained, and not returned."""
    names = sorted(set().union(*(r.outcomes for r in results.values())))
    flagged = dict(results["fail"].flagged)
    lines = []
    for name in names:
        seen = {mode: results[mode].outcomes.get(name, "missing") for mode in MODES}
        if len(set(seen.values())) == 1:
            continue
        outcomes = ", ".join(f"{mode} {seen[mode]}" for mode in MODES)
        line = f"round {round_no}: {name}: {outcomes}"
        found = {
            mode: codes
            for mode in ("warn", "fail")
            if (codes := dict(results[mode].flagged).get(name))
        }
        if found:
            line += "; findings " + ", ".join(f"{mode} {codes}" for mode, codes in found.items())
        if seen["plain"] == seen["warn"] and "error" in seen["fail"] and name in flagged:
            print(f"  explained by the guard's findings {flagged[name]} in fail mode: {line}")
            continue
        lines.append((name, line))
    return lines


def measure(
    suites: Sequence[Suite],
    rounds: int,
    side: Path = DEFAULT_SIDE,
    extra: Sequence[str] = (),
    short_rounds: int | None = None,
) -> list[Figure]:
    """Each suite's figures: ``rounds`` rounds of a slow suite, ``short_rounds`` (default:
    ``rounds``) of the others, whose runs of a few seconds move by more than 5 % alone."""
    setup(side, suites)
    figures: list[Figure] = []
    for suite in suites:
        got, _ = measure_suite(
            side, suite, rounds if suite.slow or short_rounds is None else short_rounds, extra
        )
        figures += got
    return figures


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suites",
        default=",".join(SUITES),
        help=f"comma-separated, of: {', '.join(ALL_SUITES)} (default: {', '.join(SUITES)})",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, modes alternating (3)")
    parser.add_argument("--side", type=Path, default=DEFAULT_SIDE, help="the side folder")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    parser.add_argument("--setup-only", action="store_true", help="build the side folder, stop")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.suites.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_SUITES]
    if unknown:
        parser.error(f"--suites: unknown {', '.join(unknown)}; accepted: {', '.join(ALL_SUITES)}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    suites = [ALL_SUITES[n] for n in names]
    if args.setup_only:
        setup(args.side, suites)
        return []
    result = measure(suites, args.rounds, args.side, args.pytest_args.split())
    return report(result, args.json)


if __name__ == "__main__":
    main()
