"""Shared test fixtures: where the repository and the reference data are, the local Slurm
cluster, and a sweep name unique to a test."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.validation.refdata import FETCH_HINT, refdata_dir
from tests.slurm_sweeps import cancel_sweep

REPO = Path(__file__).resolve().parents[1]
REFDATA = refdata_dir()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session", autouse=True)
def _cpu_peak_cache_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The host records of CPU peaks (sweep.workload.peak) go to a folder of the test session,
    never to the user's ~/.cache, for module-scoped fixtures and the processes they start too."""
    folder = tmp_path_factory.mktemp("cpu-peak-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWEEP_CPU_PEAK_CACHE", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def cpu_peak_cache(_cpu_peak_cache_of_the_session: Path, tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts with no host record of CPU peaks: a fresh folder of its own."""
    folder = tmp_path_factory.mktemp("cpu-peak-cache")
    monkeypatch.setenv("SWEEP_CPU_PEAK_CACHE", str(folder))
    return folder


@pytest.fixture(scope="session")
def demo_sweep(_cpu_peak_cache_of_the_session: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's demo sweep (examples/local-cpu.yaml), run once per test session (about 3
    minutes here) with its report: tests/commands/test_run.py checks it, and
    tests/commands/test_compare.py compares a second run of the demo with it. Tests read it or
    copy it; none changes it."""
    from sweep.cli import main

    out = tmp_path_factory.mktemp("demo") / "local-cpu"
    assert main(["run", str(REPO / "examples" / "local-cpu.yaml"), "--out", str(out)]) == 0
    return out


REFDATA_SKIP = "no reference data in"


@pytest.fixture(scope="session")
def refdata() -> Path:
    """The third-party reference data (data/README.md). Absent, the tests that need it skip:
    a fresh clone has none, and llm-sweep does not redistribute it. Present, none may skip
    (`pytest_sessionfinish`), so a run that has the data runs every test that needs it."""
    if not REFDATA.is_dir():
        if os.environ.get("SWEEP_REQUIRE_REFDATA") == "1":  # .ci/run, where CI provides the data
            pytest.fail(f"SWEEP_REQUIRE_REFDATA=1 but {REFDATA} is not a folder: {FETCH_HINT}")
        pytest.skip(f"{REFDATA_SKIP} {REFDATA}: {FETCH_HINT}")
    return REFDATA


# Test ids that skipped for want of the reference data. Under pytest-xdist the controller sees
# every worker's reports through this same hook, so the count is the whole run's.
_REFDATA_SKIPS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and REFDATA_SKIP in str(report.longrepr):
        _REFDATA_SKIPS.append(report.nodeid)


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, wall) of the whole machine: CPU-seconds spent by anything (user, nice, system,
    interrupts; not idle, I/O wait or a hypervisor's steal) since boot, and seconds since boot,
    from /proc/stat and /proc/uptime. None where Linux's /proc is not there."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), uptime


_CPU_AT_START: list[tuple[float, float]] = []
# SWEEP_TEST_CPU_TOP=N: list the N tests that kept the cores busiest. Each test's (busy
# CPU-seconds, wall seconds, test id), set-up and tear-down included, is the machine's, so it is
# the test's own only when tests run one at a time (no pytest-xdist). Measured only when asked.
CPU_TOP = int(os.environ.get("SWEEP_TEST_CPU_TOP") or 0)
_CPU_BY_TEST: list[tuple[float, float, str]] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    reading = machine_cpu_s()
    if reading is not None:
        _CPU_AT_START.append(reading)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With the data present, a test that skips for want of it is a failure: CI must run them all."""
    if REFDATA.is_dir() and _REFDATA_SKIPS:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """The reference-data verdict, and how busy the machine's cores were during the run: on a
    small machine the suite's time is its CPU work over the cores, which no scheduling of the
    tests (pytest-xdist included) can shrink."""
    now = machine_cpu_s()
    if _CPU_AT_START and now is not None and not hasattr(config, "workerinput"):
        busy, wall = now[0] - _CPU_AT_START[0][0], now[1] - _CPU_AT_START[0][1]
        cores = os.cpu_count() or 1
        if wall > 0:
            terminalreporter.write_line(
                f"machine CPU during the run: {busy:.0f} CPU-seconds busy on {cores} core(s) in "
                f"{wall:.0f} s ({busy / (cores * wall):.0%} of all cores, anything on the machine "
                f"included); the work alone needs {busy / cores:.0f} s on these cores")
    if _CPU_BY_TEST and not hasattr(config, "workerinput"):
        terminalreporter.write_sep("=", f"{CPU_TOP} tests that kept the machine's cores busiest")
        for busy, wall, nodeid in sorted(_CPU_BY_TEST, reverse=True)[:CPU_TOP]:
            terminalreporter.write_line(f"{busy:7.1f} CPU-s {wall:7.1f} s  {nodeid}")
    skipped = _REFDATA_SKIPS
    if REFDATA.is_dir() and skipped:
        terminalreporter.write_line(
            f"reference data: {len(skipped)} test(s) skipped although {REFDATA} exists "
            f"(first: {skipped[0]}); the run fails", red=True)
    elif skipped:
        terminalreporter.write_line(
            f"reference data: {len(skipped)} test(s) need the third-party reference data, which a clone "
            f"does not include, and skipped. data/README.md names each file's public source; "
            f"{FETCH_HINT}.", yellow=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How pytest-xdist (`--dist loadgroup`, scripts/test.sh) shares the tests among workers: a
    file's tests stay together, so its module-scoped fixtures (the demo sweep, the fits on the
    reference data) are built once; the live-cluster tests, which share the local cluster's four
    nodes and of which some kill a node's slurmd, run one at a time on one worker."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    # The session's demo sweep is run once, by one worker: every test of a file that uses it
    # goes with it, so that file's module fixtures (a second demo sweep) are not torn down and
    # built again between its tests.
    demo_files = {file_of(item) for item in items
                  if "demo_sweep" in getattr(item, "fixturenames", ())}
    for item in items:
        if item.get_closest_marker("slurm"):
            group = "slurm"
        elif file_of(item) in demo_files:
            group = "demo"
        else:
            group = file_of(item)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A test marked `alone` runs while no other test on this machine runs (its set-up and
    tear-down included): it leaves processes that the product is right to clean up from any job
    on the machine (a dead watchdog's tree), so no other sweep may start meanwhile, whether in
    another pytest-xdist worker or in another test session of this user. The others share."""
    with run_barrier(alone=item.get_closest_marker("alone") is not None):
        before = machine_cpu_s() if CPU_TOP > 0 else None
        yield
        after = machine_cpu_s() if before is not None else None
    if before is not None and after is not None:
        _CPU_BY_TEST.append((after[0] - before[0], after[1] - before[1], item.nodeid))


@contextlib.contextmanager
def run_barrier(*, alone: bool) -> Iterator[None]:
    """A readers-writer lock on two files of this user, fair to the writer: each test takes a
    turnstile on its way in, and an `alone` test holds it until it has the room to itself, so
    tests that arrive while it waits queue behind it instead of starving it."""
    import fcntl
    import tempfile

    stem = Path(tempfile.gettempdir()) / f"llm-sweep-tests-{os.getuid()}"
    with open(f"{stem}.turnstile", "a+") as turnstile, open(f"{stem}.room", "a+") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


def slurm_available() -> bool:
    """A live local cluster: `scontrol ping` answers."""
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        return False
    result = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and "UP" in result.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Tests marked with this need the real cluster of scripts/local-slurm.sh.

    Under the test command (SWEEP_REQUIRE_SLURM=1) a missing cluster fails the test; elsewhere
    it skips, so a developer without root can still run the rest.
    """
    import os

    if slurm_available():
        return
    message = "no Slurm cluster answers `scontrol ping`: run `bash scripts/local-slurm.sh start` as root"
    if os.environ.get("SWEEP_REQUIRE_SLURM") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def sweep_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A sweep name of this test and process, as job comments carry it; whatever the sweep
    leaves in Slurm is cancelled after the test."""
    test = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)  # parametrised ids have [ ]
    name = f"s{os.getpid()}-{test[-18:].strip('-')}"
    yield name
    cancel_sweep(name)
