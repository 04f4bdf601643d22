"""The watchdog, run as `python -m sweep.job.watchdog` around real launcher processes.

Every launcher is a real process tree (bash, python); nothing is mocked. Timeouts are 1-3 s so
the file stays quick. torchrun/gloo ranks: test_watchdog_gloo.py; Slurm: test_watchdog_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.core.state import read_json
from tests.watchdog_runs import REPO, Run, kill_leftovers, wait_for_step


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    made = Run(tmp_path)
    yield made
    kill_leftovers(made)


def test_a_run_that_finishes_is_completed_with_its_last_step(run: Run) -> None:
    done = run.supervise(run.python("steps(4)\nprint('done')"))
    assert done.returncode == 0, done.stderr
    status = run.status
    assert (status["outcome"], status["last_step"]) == ("completed", 4)
    assert status["exit_codes"] == {"node0": 0}
    assert status["run_id"] == run.run_dir.name and status["attempt"] == 1
    assert status["writer"] == "watchdog" and status["ended_at"] >= status["started_at"]
    assert (run.attempt / "logs" / "node0.out").read_text() == "done\n"
    node0 = read_json(run.attempt / "node0.json")
    assert node0["outcome"] == "completed"
    kinds = [e["event"] for e in run.events()]
    assert kinds.index("status") > kinds.index("node_verdict") > kinds.index("launch")


def test_the_launcher_runs_in_its_own_session_with_the_tag_in_its_environment(run: Run) -> None:
    done = run.supervise(run.python("""
        print(os.getsid(0) == os.getpid(), os.environ["SWEEP_TAG"], os.environ["SWEEP_RUN_ID"],
              os.environ["SWEEP_ATTEMPT"],
              os.environ["SWEEP_WATCHDOG"].split(":")[0] == str(os.getppid()))
        steps(1)
    """))
    assert done.returncode == 0, done.stderr
    printed = (run.attempt / "logs" / "node0.out").read_text().split()
    assert printed == ["True", run.tag, run.run_dir.name, "1", "True"]


def test_no_new_step_within_the_hang_timeout_is_a_hang_and_the_whole_tree_dies(run: Run) -> None:
    launcher = run.python("""
        import subprocess
        subprocess.Popen(["sleep", "300"])                        # a child in the session
        subprocess.Popen(["sleep", "301"], start_new_session=True)  # one that left it
        steps(2)
        time.sleep(300)
    """)
    started = time.monotonic()
    done = run.supervise(launcher)
    elapsed = time.monotonic() - started
    status = run.status
    assert done.returncode == 1
    assert (status["outcome"], status["reason"]) == ("hang", "no_progress_step")
    assert status["last_step"] == 2
    assert "watchdog: no progress after step 2; stopped the process tree" in status["evidence"]
    assert elapsed < 2 + 10
    assert run.survivors() == []
    stop = read_json(run.attempt / "node0.json")["observed"]["stop"]
    assert len(stop["escaped"]) == 1 and stop["survivors"] == []


def test_a_launcher_that_exits_0_on_our_sigterm_is_still_a_hang(tmp_path: Path) -> None:
    run = Run(tmp_path, steps=10)
    done = run.supervise(run.python("""
        import signal
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        steps(2)
        time.sleep(300)
    """))
    assert done.returncode == 1
    assert run.status["exit_codes"] == {"node0": 0}
    assert (run.status["outcome"], run.status["last_step"]) == ("hang", 2)


def test_no_first_step_within_the_startup_timeout_is_a_startup_hang(run: Run) -> None:
    done = run.supervise(["bash", "-c", "sleep 300 & sleep 300; wait"])
    assert done.returncode == 1
    assert (run.status["outcome"], run.status["reason"], run.status["last_step"]) == \
        ("hang", "no_progress_startup", None)
    assert run.survivors() == []


def test_a_grandchild_that_escaped_with_setsid_is_found_by_tag_and_killed(run: Run) -> None:
    done = run.supervise(["bash", "-c", f"setsid sleep 300 & echo $! > {run.root}/escaped.pid; "
                                        f"{sys.executable} -c 'print(1)'; exit 0"])
    assert done.returncode == 0, done.stderr
    stop = read_json(run.attempt / "node0.json")["observed"]["stop"]
    assert stop["escaped"] and stop["survivors"] == []
    assert run.status["outcome"] == "completed"
    assert run.survivors() == []


def test_zombies_left_by_the_launcher_are_reaped_by_the_watchdog(run: Run) -> None:
    launcher = run.python("""
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            kids.append(pid)
        print(*kids, flush=True)
        steps(1)
        time.sleep(300)  # never waits for its children: they stay zombies until it dies
    """)
    done = run.supervise(launcher)
    assert done.returncode == 1 and run.status["outcome"] == "hang"
    zombies = {int(pid) for pid in (run.attempt / "logs" / "node0.out").read_text().split()}
    stop = read_json(run.attempt / "node0.json")["observed"]["stop"]
    assert zombies <= set(stop["reaped"])  # reparented to the watchdog (subreaper), reaped there
    assert not any(Path(f"/proc/{pid}").exists() for pid in zombies)


def test_a_crash_is_crashed_with_the_traceback_line_as_evidence(run: Run) -> None:
    done = run.supervise(run.python("steps(2)\nraise ValueError('bad shape 42')"))
    assert done.returncode == 1
    status = run.status
    assert status["outcome"] == "crashed" and status["exit_codes"] == {"node0": 1}
    assert "ValueError: bad shape 42" in status["evidence"]
    assert status["last_step"] == 2


def test_a_cuda_oom_text_is_oom_with_that_line(run: Run) -> None:
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.10 GiB")
    done = run.supervise(run.python(f"steps(1)\nprint({line!r}, file=sys.stderr)\nsys.exit(1)"))
    assert done.returncode == 1
    assert run.status["outcome"] == "oom"
    assert line in run.status["evidence"]


@pytest.mark.parametrize(("signum", "outcome", "exit_code"),
                         [(signal.SIGUSR1, "timeout", 128 + signal.SIGTERM),
                          (signal.SIGTERM, "cancelled", 128 + signal.SIGTERM)])
def test_slurm_signals_stop_the_tree_and_say_why(run: Run, signum: int, outcome: str,
                                                 exit_code: int) -> None:
    proc = run.start(run.python("steps(10000, gap=0.1)"))
    wait_for_step(run)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    status = run.status
    assert status["outcome"] == outcome and status["signals"] == [signal.Signals(signum).name[3:]]
    assert status["exit_codes"] == {"node0": -signal.SIGTERM} and proc.returncode == exit_code
    assert status["last_step"] >= 1
    assert run.survivors() == []


@pytest.mark.alone  # its stale processes are fair game for any other test's watchdog
def test_stale_processes_of_a_dead_watchdog_are_cleaned_but_a_live_runs_are_not(
        tmp_path: Path) -> None:
    stale, live, fresh = (Run(tmp_path / name, startup_timeout_s=120)
                          for name in ("stale", "live", "fresh"))
    sleeper = ["bash", "-c", "setsid sleep 300 & sleep 300"]
    dead = stale.start(sleeper)
    alive = live.start(sleeper)
    try:
        for r in (stale, live):
            deadline = time.monotonic() + 20
            while len(r.survivors()) < 3:  # bash + two sleeps
                assert time.monotonic() < deadline, "launcher did not start"
                time.sleep(0.05)
        dead.kill()  # SIGKILL: no chance to clean up, as when Slurm's KillWait runs out
        dead.wait()
        stale_pids = {p.pid for p in stale.survivors()}
        live_pids = {p.pid for p in live.survivors()}
        assert len(stale_pids) == 3

        done = fresh.supervise(["true"])
        assert done.returncode == 0, done.stderr
        clean = fresh.events("prelaunch_clean")[0]
        assert {k["pid"] for k in clean["killed"]} == stale_pids
        assert live_pids <= {k["pid"] for k in clean["left_alone"]}
        assert stale.survivors() == []
        assert {p.pid for p in live.survivors()} == live_pids
    finally:
        alive.send_signal(signal.SIGTERM)
        alive.communicate(timeout=30)
        for p in stale.survivors() + live.survivors():
            os.kill(p.pid, signal.SIGKILL)
    assert live.status["outcome"] == "cancelled"


def test_a_failed_node_stops_the_others_and_node0_writes_the_runs_verdict(tmp_path: Path) -> None:
    run = Run(tmp_path, nodes=2, hang_timeout_s=120)
    env = {"SLURM_NNODES": "2"}
    node1 = run.start(run.python("steps(1)\nraise RuntimeError('rank 1 died')"),
                      env={**env, "SLURM_NODEID": "1", "SLURMD_NODENAME": "n1"})
    node0 = run.start(run.python("steps(1)\ntime.sleep(300)"),  # its ranks wait on the dead peer
                      "--node-wait-s", "20",
                      env={**env, "SLURM_NODEID": "0", "SLURMD_NODENAME": "n0"})
    started = time.monotonic()
    node0.communicate(timeout=60)
    node1.communicate(timeout=60)
    assert time.monotonic() - started < 30
    status = run.status
    assert (status["outcome"], status["node"], status["nodes"]) == ("crashed", "n0", ["n0", "n1"])
    assert status["evidence"] == ["RuntimeError: rank 1 died"]
    assert status["exit_codes"] == {"node0": -signal.SIGTERM, "node1": 1}
    assert run.events("peer_failed")[0]["peer"] == "node1"
    # node 1 exits (and srun --kill-on-bad-exit would TERM node 0) only once status.json exists
    (node1_exit,) = [e for e in run.events("exit") if e["node"] == 1]
    (written,) = run.events("status")
    assert node1_exit["time"] >= written["time"]
    assert (node1.returncode, node0.returncode) == (1, 128 + signal.SIGTERM)


def test_node0_calls_a_node_that_wrote_no_verdict_a_node_failure(tmp_path: Path) -> None:
    run = Run(tmp_path, nodes=2)
    done = run.supervise(run.python("steps(1)"), "--node-wait-s", "0.5",
                         env={"SLURM_NNODES": "2", "SLURM_NODEID": "0"})
    assert done.returncode == 0  # node 0's own launcher did fine
    status = run.status
    assert (status["outcome"], status["missing_nodes"]) == ("node_fail", ["node1"])
    assert status["exit_codes"] == {"node0": 0, "node1": None}


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    run = Run(tmp_path)
    (run.run_dir / "run.json").unlink()
    done = run.supervise(["true"])
    assert done.returncode == 2 and "run.json not found" in done.stderr
    assert "Traceback" not in done.stderr
    run = Run(tmp_path / "b")
    done = subprocess.run(run.argv([])[:-1], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no launcher command" in done.stderr


def test_a_launcher_that_cannot_start_is_crashed(run: Run) -> None:
    done = run.supervise([str(run.root / "no-such-launcher")])
    assert done.returncode == 127
    assert (run.status["outcome"], run.status["reason"]) == ("crashed", "launcher_failed_to_start")
    assert "no-such-launcher" in json.dumps(run.status["evidence"])


def test_after_a_term_node0_does_not_wait_long_for_a_missing_node(tmp_path: Path) -> None:
    """Slurm sends KILL KillWait seconds after TERM: status.json must be written before that."""
    run = Run(tmp_path, nodes=2)
    proc = run.start(run.python("steps(10000, gap=0.1)"), "--node-wait-s", "60",
                     env={"SLURM_NNODES": "2", "SLURM_NODEID": "0"})
    wait_for_step(run)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert time.monotonic() - sent < 5  # signal grace (1 s) + the short wait, not 60 s
    assert (run.status["outcome"], run.status["missing_nodes"]) == ("cancelled", ["node1"])


def test_the_watchdog_of_a_builtin_run_loads_no_numpy() -> None:
    """The watchdog shares the job's memory cgroup with the ranks, and the kernel kills the
    largest process there: numpy's 11 MiB made the watchdog that process in a 64 MiB cgroup
    (tests/job/test_jobinfo.py), and a killed watchdog records no verdict. Asking the built-in
    adapter how its runs report must not load it."""
    code = ("import sys, sweep.job.watchdog as w; assert w._writes_metrics_file('builtin'); "
            "print('numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
