"""The watchdog, run as `python -m sweep.watchdog` around real launcher processes.

Every launcher here is a real process tree (bash/python, and torchrun with gloo ranks in the
`gloo` tests); nothing is mocked. Timeouts are 1-3 s so the whole file stays quick.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweep import proctree
from sweep.layout import Layout
from sweep.model import ModelShape
from sweep.runconfig import RunConfig
from sweep.state import atomic_write_json, new_attempt_dir, read_json, read_jsonl

REPO = Path(__file__).resolve().parents[1]
TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                  ffn_hidden_size=128, vocab_size=256, tie_word_embeddings=True)

# A launcher that writes `n` builtin step records to metrics.jsonl, `gap` seconds apart.
STEPS = """
import json, os, sys, time
path = os.path.join(os.environ["SWEEP_ATTEMPT_DIR"], "metrics.jsonl")
def steps(n, gap=0.05, start=1):
    for step in range(start, start + n):
        with open(path, "a") as f:
            f.write(json.dumps({"kind": "step", "step": step, "time": time.time()}) + "\\n")
        time.sleep(gap)
"""


class Run:
    """A rendered run directory with one attempt folder, and helpers to supervise a launcher."""

    def __init__(self, root: Path, *, nodes: int = 1, batch: int = 1, **settings: Any) -> None:
        config = RunConfig(sweep="t", framework="builtin", model=TINY,
                           layout=Layout(dp=1, tp=1, pp=1), nodes=nodes, gpus_per_node=1, gpu="cpu",
                           dtype="fp32", seq_len=32, global_batch_sequences=batch,
                           settings={"startup_timeout_s": 3, "hang_timeout_s": 2, **settings})
        self.root = root
        self.run_dir = root / "runs" / config.run_id
        atomic_write_json(self.run_dir / "run.json", config.to_json())
        self.attempt = new_attempt_dir(self.run_dir)
        self.tag = f"{config.run_id}/1"

    def argv(self, launcher: list[str], *options: str) -> list[str]:
        return [sys.executable, "-m", "sweep.watchdog", "--run-dir", str(self.run_dir),
                "--attempt-dir", str(self.attempt), "--poll-s", "0.1", "--grace-s", "1",
                "--signal-grace-s", "1", "--node-wait-s", "0", "--shm-dir", str(self.root / "shm"),
                "--tmp-dir", str(self.root / "tmp"), *options, "--", *launcher]

    def start(self, launcher: list[str], *options: str, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(launcher, *options), cwd=REPO, text=True,
                                env={**os.environ, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def supervise(self, launcher: list[str], *options: str, timeout: float = 60,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = self.start(launcher, *options, env=env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def python(self, code: str) -> list[str]:
        script = self.root / f"launcher_{len(list(self.root.glob('launcher_*')))}.py"
        script.write_text(STEPS + textwrap.dedent(code))
        return [sys.executable, str(script)]

    @property
    def status(self) -> dict[str, Any]:
        status = read_json(self.attempt / "status.json")
        assert status is not None, f"no status.json in {self.attempt}"
        return status

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.attempt / "watchdog.jsonl") if kind in (None, e["event"])]

    def survivors(self) -> list[proctree.ProcInfo]:
        return [p for p in proctree.snapshot() if p.tag == self.tag and not p.zombie]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    made = Run(tmp_path)
    yield made
    for p in made.survivors():  # only if a test failed: never leave our processes behind
        os.kill(p.pid, signal.SIGKILL)


def test_a_run_that_finishes_is_completed_with_its_last_step(run: Run) -> None:
    done = run.supervise(run.python("steps(4)\nprint('done')"))
    assert done.returncode == 0, done.stderr
    status = run.status
    assert (status["outcome"], status["last_step"], status["exit_codes"]) == ("completed", 4, {"node0": 0})
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
              os.environ["SWEEP_ATTEMPT"], os.environ["SWEEP_WATCHDOG"].split(":")[0] == str(os.getppid()))
        steps(1)
    """))
    assert done.returncode == 0, done.stderr
    leader, tag, run_id, attempt, owner_is_parent = (run.attempt / "logs" / "node0.out").read_text().split()
    assert (leader, tag, run_id, attempt, owner_is_parent) == ("True", run.tag, run.run_dir.name, "1", "True")


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
    assert (status["outcome"], status["reason"], status["last_step"]) == ("hang", "no_progress_step", 2)
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
    done = run.supervise(["bash", "-c", "setsid sleep 300 & echo $! > escaped.pid; "
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
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
    done = run.supervise(run.python(f"steps(1)\nprint({line!r}, file=sys.stderr)\nsys.exit(1)"))
    assert done.returncode == 1
    assert run.status["outcome"] == "oom"
    assert line in run.status["evidence"]


def _wait_for_step(run: Run, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (run.attempt / "metrics.jsonl").exists():
        assert time.monotonic() < deadline, "the launcher never wrote a step"
        time.sleep(0.05)


@pytest.mark.parametrize(("signum", "outcome", "exit_code"),
                         [(signal.SIGUSR1, "timeout", 128 + signal.SIGTERM),
                          (signal.SIGTERM, "cancelled", 128 + signal.SIGTERM)])
def test_slurm_signals_stop_the_tree_and_say_why(run: Run, signum: int, outcome: str,
                                                 exit_code: int) -> None:
    proc = run.start(run.python("steps(10000, gap=0.1)"))
    _wait_for_step(run)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    status = run.status
    assert status["outcome"] == outcome and status["signals"] == [signal.Signals(signum).name[3:]]
    assert status["exit_codes"] == {"node0": -signal.SIGTERM} and proc.returncode == exit_code
    assert status["last_step"] >= 1
    assert run.survivors() == []


def test_stale_processes_of_a_dead_watchdog_are_cleaned_but_a_live_runs_are_not(tmp_path: Path) -> None:
    stale, live, fresh = (Run(tmp_path / name, batch=batch, startup_timeout_s=120)
                          for batch, name in enumerate(("stale", "live", "fresh"), start=2))
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
                      "--node-wait-s", "20", env={**env, "SLURM_NODEID": "0", "SLURMD_NODENAME": "n0"})
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
    assert node1_exit["time"] >= written["time"] and (node1.returncode, node0.returncode) == (1, 143)


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
    assert done.returncode == 2 and "run.json not found" in done.stderr and "Traceback" not in done.stderr
    run = Run(tmp_path / "b")
    done = subprocess.run(run.argv([])[:-1], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no launcher command" in done.stderr


def test_a_launcher_that_cannot_start_is_crashed(run: Run) -> None:
    done = run.supervise([str(run.root / "no-such-launcher")])
    assert done.returncode == 127
    assert (run.status["outcome"], run.status["reason"]) == ("crashed", "launcher_failed_to_start")
    assert "no-such-launcher" in json.dumps(run.status["evidence"])


# --- real torch.distributed ranks (gloo on CPU) under torchrun -------------------------------

RANK = """
import json, os, resource, sys, time
import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ["SWEEP_ATTEMPT_DIR"]
with open(os.path.join(attempt, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
x = torch.ones(4)
for step in range(1, 100000):
    if step == 3 and rank == 1:
        if mode == "hang":    # stops calling collectives; rank 0 waits in all_reduce
            time.sleep(3600)
        if mode == "oom":     # a per-rank address-space limit, as rank_memory_limit_mb sets
            with open("/proc/self/status") as status:
                vm = next(int(l.split()[1]) for l in status if l.startswith("VmSize:")) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))
            torch.empty(4 << 30, dtype=torch.uint8)
        if mode == "raise":
            raise RuntimeError("rank 1 lost its shard at step 3")
    dist.all_reduce(x)
    if rank == 0:
        with open(os.path.join(attempt, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"kind": "step", "step": step, "time": time.time()}) + "\\n")
    time.sleep(0.2)
"""


def torchrun(run: Run, mode: str) -> list[str]:
    script = run.root / "rank.py"
    script.write_text(RANK)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--monitor-interval", "0.2", str(script), mode]


def rank_pids(run: Run) -> list[int]:
    return [int((run.attempt / f"rank{r}.pid").read_text()) for r in (0, 1)]


@pytest.fixture
def gloo_run(tmp_path: Path) -> Iterator[Run]:
    made = Run(tmp_path, startup_timeout_s=60, hang_timeout_s=3)
    yield made
    for p in made.survivors():
        os.kill(p.pid, signal.SIGKILL)


@pytest.mark.slow
def test_gloo_a_rank_that_stops_calling_collectives_is_a_hang_and_nothing_survives(gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "hang"))
    proc.communicate(timeout=120)
    status = run.status
    assert (status["outcome"], status["last_step"]) == ("hang", 2)
    hang = run.events("hang")[0]
    last_step_at = max(r["time"] for r in read_jsonl(run.attempt / "metrics.jsonl"))
    assert hang["time"] - last_step_at <= 3 + 10
    assert run.survivors() == []
    assert not any(proctree.alive(pid) for pid in rank_pids(run))
    stop = read_json(run.attempt / "node0.json")["observed"]["stop"]
    assert set(rank_pids(run)) <= set(stop["escaped"])  # torchrun puts ranks in new sessions


@pytest.mark.slow
def test_gloo_a_rank_past_its_address_space_limit_is_oom_with_the_allocator_line(gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "oom"))
    proc.communicate(timeout=120)
    status = run.status
    assert status["outcome"] == "oom", status
    assert any("DefaultCPUAllocator: can't allocate memory" in line for line in status["evidence"])
    assert run.survivors() == []


@pytest.mark.slow
def test_gloo_a_rank_that_raises_is_crashed_with_its_traceback_line(gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "raise"))
    proc.communicate(timeout=120)
    status = run.status
    assert status["outcome"] == "crashed", status
    assert status["evidence"] == ["[rank1]: RuntimeError: rank 1 lost its shard at step 3"]
    assert status["exit_codes"] == {"node0": 1}
    assert run.survivors() == []


@pytest.mark.slow
def test_gloo_when_torchrun_is_sigkilled_its_workers_are_found_by_tag_and_killed(gloo_run: Run) -> None:
    run = gloo_run
    proc = run.start(torchrun(run, "train"))
    _wait_for_step(run, timeout=60)
    launcher = run.events("launch")[0]["pid"]
    workers = rank_pids(run)
    assert all(proctree.alive(pid) for pid in workers)
    os.kill(launcher, signal.SIGKILL)
    proc.communicate(timeout=60)
    status = run.status
    assert status["exit_codes"] == {"node0": -signal.SIGKILL}
    assert status["outcome"] == "crashed", status
    assert not any(proctree.alive(pid) for pid in workers)
    assert set(workers) <= set(read_json(run.attempt / "node0.json")["observed"]["stop"]["escaped"])
    assert run.survivors() == []


# --- under the local Slurm cluster (scripts/local-slurm.sh start) -----------------------------

JOB = """#!/bin/bash
#SBATCH --nodes=1 --time=1 --no-requeue {signal}
srun --nodes=1 --ntasks-per-node=1 {python} -m sweep.watchdog --run-dir {run_dir} \\
  --attempt-dir {attempt} --poll-s 0.2 --node-wait-s 0 -- {python} {launcher} &
SRUN_PID=$!
forward() {{ kill -s "$1" "$SRUN_PID" 2>/dev/null || true; }}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while true; do
  wait "$SRUN_PID" && status=0 || status=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done
exit "$status"
"""


def sbatch_and_wait(run: Run, signal_option: str, timeout: float) -> str:
    launcher = run.python("steps(100000, gap=0.5)")
    script = run.root / "job.sbatch"
    script.write_text(JOB.format(signal=signal_option, python=sys.executable, run_dir=run.run_dir,
                                 attempt=run.attempt, launcher=launcher[1]))
    job_id = subprocess.run(["sbatch", "--parsable", f"--chdir={REPO}", f"--output={run.root}/job.out",
                             str(script)], capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                             capture_output=True, text=True).stdout.split()
        state = out[0] if out else ""
        if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"):
            return state
        time.sleep(1)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")


def _slurm_up() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


slurm = pytest.mark.skipif(not _slurm_up(), reason="no local Slurm cluster (scripts/local-slurm.sh start)")


@slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_the_usr1_before_the_time_limit_is_a_timeout(run: Run) -> None:
    state = sbatch_and_wait(run, "--signal=B:USR1@30", timeout=150)
    status = run.status
    assert (status["outcome"], status["signals"]) == ("timeout", ["USR1"]), status
    assert status["slurm_job_id"] and status["last_step"] >= 1
    assert state == "COMPLETED" or state.startswith("FAILED")  # the job ended itself, before the limit
    assert run.survivors() == []


@slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_a_time_limit_without_signal_is_a_timeout_from_the_job_end_time(run: Run) -> None:
    from sweep.classify import Evidence, classify

    state = sbatch_and_wait(run, "", timeout=200)
    assert state == "TIMEOUT"
    status = run.status  # the TERM came at the job's end time (squeue %e): Slurm's limit
    assert (status["outcome"], status["signals"]) == ("timeout", ["TERM"]), status
    assert run.events("launch")[0]["job_end"] is not None
    # and when a watchdog cannot tell (or wrote nothing), sacct decides
    verdict = classify(Evidence(exit_codes={"node0": -15}, signals=("TERM",), slurm_state=state,
                                slurm_exit_code="0:15"))
    assert verdict.outcome == "timeout"
    assert run.survivors() == []
