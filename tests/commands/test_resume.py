"""Faults on the real local cluster, then `sweep resume`: a time limit, an OOM under --mem, a
cancel, a crash and a node failure (`scripts/local-slurm.sh kill-node`) are each classified;
the failed node joins the exclude list; resume submits exactly the failed runs, once.

The runs' job.sbatch and watchdog are the real ones; only the launcher is a test template
(the spec's `templates_dir`): it sleeps, allocates past --mem, or exits 3, according to the
FAULT variable each run's settings export, so that no trainer burns the CI's two cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from sweep.backends.slurm.submission import latest_tasks, submissions
from sweep.backends.slurm.tracker import Tracker
from sweep.cli import main
from sweep.core.state import read_jsonl
from tests.slurm_sweeps import cancel_sweep, job_path, wait_until_settled

__all__ = ["job_path"]  # a fixture

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-slurm.sh"
LAUNCHER = """#!/bin/bash
# test launcher for run {{ run_id | comment }}: a fault instead of a trainer
case "${FAULT:-sleep}" in
  oom) exec {{ s.python | shq }} -c "import time; x = [b'x' * (1 << 20) for _ in range(2000)]; time.sleep(60)" ;;
  crash) echo "test launcher: failing on purpose" >&2; exit 3 ;;
  *) exec sleep 300 ;;
esac
"""
OTHERS = ["node1", "node3", "node4"]
# One CPU rank per node, the test launcher above: the part every spec of this file shares.
SWEEP = """
name: {name}
framework: builtin
gpu: cpu
gpus_per_node: 1
dtype: fp32
templates_dir: templates
models: [tiny-4l]
seq_len: 64
global_batch: {{sequences: 8}}
"""
SPEC = SWEEP + f"""nodes: [1]
axes: {{{{mbs: [1, 2, 4], zero_stage: [0], recompute: [none, full]}}}}
run:
  time_limit: "00:05:00"
  signal_before_s: 30
  startup_timeout_s: 900
  hang_timeout_s: 900
  mem: "400M"
  exclusive: false
  exclude: [node2]
overrides:
  - where: {{{{mbs: 1, recompute: none}}}}
    set: {{{{time_limit: "00:01:00", signal_before_s: 5, env: {{{{FAULT: sleep}}}}}}}}
  - where: {{{{mbs: 1, recompute: full}}}}
    set: {{{{mem: "250M", env: {{{{FAULT: oom}}}}}}}}
  - where: {{{{mbs: 2, recompute: full}}}}
    set: {{{{env: {{{{FAULT: crash}}}}}}}}
  - where: {{{{mbs: 4}}}}
    set: {{{{exclude: {OTHERS}}}}}
"""
EXPECTED = {(1, 0): "timeout", (1, 1): "oom", (2, 0): "cancelled", (2, 1): "crashed",
            (4, 0): "node_fail", (4, 1): "node_fail"}


def local_slurm(*args: str) -> None:
    subprocess.run(["bash", str(SCRIPT), *args], check=True, capture_output=True, timeout=120)


def squeue_nodes(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %N"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.slurm
@pytest.mark.slow
def test_faults_are_classified_and_resume_reruns_exactly_the_failed_runs(
        slurm_cluster: None, job_path: None, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("killing a node's slurmd needs root (scripts/local-slurm.sh kill-node)")
    (tmp_path / "templates" / "launch").mkdir(parents=True)
    (tmp_path / "templates" / "launch" / "builtin.sh.j2").write_text(LAUNCHER)
    name = f"faults{os.getpid()}"
    try:
        run_faults(name, tmp_path, capsys)
    finally:
        cancel_sweep(name)


def run_faults(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(name=name))
    out = tmp_path / "sweep"
    assert main(["submit", str(spec), "--out", str(out), "--no-report"]) == 0
    tracker = Tracker(out)
    layout = {}
    for run_id in tracker.run_ids():
        doc = json.loads((out / "runs" / run_id / "run.json").read_text())
        # Six runs, told apart by (mbs, recompute none = 0 / full = 1); ZeRO stages would not
        # do: with one rank they are one run, which the planner plans once.
        layout[(doc["layout"]["mbs"], int(doc["layout"]["recompute"] == "full"))] = run_id
    tasks = {run: task.task_id for run, task in latest_tasks(tracker.submissions()).items()}
    killed = False
    try:
        # Everything running; the two node-failure runs share node2, the others never use it.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            states = {run: squeue_nodes(task) for run, task in tasks.items()}
            if all(s.startswith("RUNNING") for s in states.values()):
                break
            time.sleep(1)
        assert squeue_nodes(tasks[layout[(4, 0)]]) == "RUNNING node2"
        assert squeue_nodes(tasks[layout[(4, 1)]]) == "RUNNING node2"
        # Kill the node once the srun steps run: a node that dies while a job is still
        # launching its step fails the job (FAILED 105, srun could not launch), not NODE_FAIL.
        events = [out / "runs" / layout[key] / "attempts" / "1" / "watchdog.jsonl"
                  for key in ((4, 0), (4, 1))]
        while time.monotonic() < deadline and not all(
                path.is_file() and '"launch"' in path.read_text() for path in events):
            time.sleep(0.5)
        assert main(["cancel", str(out), "--run", layout[(2, 0)]]) == 0
        local_slurm("kill-node", "node2")
        killed = True
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            node_failed = {s.run_id: s.state for s in tracker.observe().states
                           if s.run_id in (layout[(4, 0)], layout[(4, 1)])}
            if set(node_failed.values()) == {"node_fail"}:
                break
            time.sleep(2)
    finally:
        if killed:
            local_slurm("restart-node", "node2")
    observation = wait_until_settled(out, timeout_s=180)
    got = {key: next(s.state for s in observation.states if s.run_id == run)
           for key, run in layout.items()}
    assert got == EXPECTED, [(s.run_id, s.state, s.reason) for s in observation.states]
    # One slurmd death ended both jobs on node2: one incident of the node, not two, so it is not
    # excluded by itself (bad_nodes.json keeps both failures, with the jobs' end times).
    assert observation.excluded == []
    failures = json.loads((out / "bad_nodes.json").read_text())["failures"]
    assert sorted(f["run_id"] for f in failures) == sorted([layout[(4, 0)], layout[(4, 1)]])
    ends = [f["ended_at"] for f in failures]
    assert None not in ends and abs(ends[0] - ends[1]) <= 60
    assert main(["nodes", str(out), "--exclude", "node2"]) == 0  # kept out by hand
    assert Tracker(out).observe().excluded == ["node2"]

    capsys.readouterr()
    assert main(["resume", str(out), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "--exclude=node2 " in dry and f"--exclude={','.join(OTHERS)},node2 " in dry
    before = len(submissions(read_jsonl(out / "ledger.jsonl")))
    assert main(["resume", str(out), "--hold"]) == 0
    [report_job] = re.findall(r"report job (\d+) collects and reports again", capsys.readouterr().out)
    assert squeue_reason(report_job) == "Dependency"  # waits for the rerun arrays to end
    new = submissions(read_jsonl(out / "ledger.jsonl"))[before:]
    resubmitted = sorted(run for sub in new for run in sub.run_ids)
    failed = sorted(layout[k] for k, v in EXPECTED.items() if v != "oom")
    assert resubmitted == failed and all(sub.job_id for sub in new)
    assert main(["resume", str(out), "--hold"]) == 0  # they are pending now: nothing twice
    assert "report job" not in capsys.readouterr().out  # nor a second report job
    assert len(submissions(read_jsonl(out / "ledger.jsonl"))) == before + len(new)
    subprocess.run(["scancel", report_job], check=False)  # the rest of the test collects itself
    capsys.readouterr()
    assert main(["resume", str(out), "--only", "oom", "--dry-run"]) == 0
    assert "would resubmit 1 run(s): 1 oom" in capsys.readouterr().out
    assert main(["cancel", str(out), "--only", "pending"]) == 0
    time.sleep(1)
    after = {s.run_id: s.state for s in Tracker(out).observe().states}
    assert sorted(r for r, state in after.items() if state == "cancelled") == failed

    # node2 given another chance by hand: its old failures no longer count
    bad_nodes = out / "bad_nodes.json"
    edited = json.loads(bad_nodes.read_text()) | {"exclude": []}
    bad_nodes.write_text(json.dumps(edited))
    assert Tracker(out).observe().excluded == []
    assert "node2" in json.loads(bad_nodes.read_text())["forgiven_at"]
    capsys.readouterr()
    assert main(["resume", str(out), "--dry-run"]) == 0
    dry = capsys.readouterr().out  # the mbs-4 runs may go back to node2 (the spec keeps the others off it)
    assert f"--exclude={','.join(OTHERS)} " in dry and f"--exclude={','.join(OTHERS)},node2 " not in dry


LAUNCH_FAILURE_SPEC = SWEEP + """nodes: [2]
axes: {{tp: [1], pp: [1], mbs: [4], zero_stage: [0], recompute: [none]}}
run: {{time_limit: "00:05:00", signal_before_s: 30, mem: "400M", exclusive: false, exclude: [node3, node4]}}
"""
# The job ends as soon as srun gives up on node2, within seconds on an idle machine. On a loaded
# one (a preflight took 42 s) a 2-minute limit, signalled 30 s before, once ended it first and it
# was recorded as a timeout: the limit is no part of what the test checks, so it has room.


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_that_cannot_start_its_step_is_a_node_failure_blamed_on_that_node(
        slurm_cluster: None, job_path: None, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """slurmctld still counts node2 as up (for SlurmdTimeout), so the job gets node1 and node2;
    srun then cannot start the step on node2. Slurm records FAILED 105:0, which reads as a
    crash: srun's "Task launch ... failed on node node2" line decides."""
    if os.geteuid() != 0:
        pytest.skip("killing a node's slurmd needs root (scripts/local-slurm.sh kill-node)")
    (tmp_path / "templates" / "launch").mkdir(parents=True)
    (tmp_path / "templates" / "launch" / "builtin.sh.j2").write_text(LAUNCHER)
    name = f"launch{os.getpid()}"
    spec, out = tmp_path / "spec.yaml", tmp_path / "sweep"
    spec.write_text(LAUNCH_FAILURE_SPEC.format(name=name))
    assert main(["render", str(spec), "--out", str(out)]) == 0
    local_slurm("kill-node", "node2")
    try:
        assert main(["submit", str(out), "--no-report"]) == 0
        observation = wait_until_settled(out, timeout_s=360)
    finally:
        local_slurm("restart-node", "node2")
        cancel_sweep(name)
    [state] = observation.states
    assert (state.state, state.reason.split(":")[0]) == ("node_fail", "srun_step_launch_failed"), state
    assert [f.nodes for f in observation.failures] == [("node2",)]  # not node1, which was fine

    capsys.readouterr()
    assert main(["nodes", str(out)]) == 0
    assert " ".join(capsys.readouterr().out.replace("│", " ").split()).count("node2 1 1 in use") == 1
    assert main(["collect", str(out)]) == 0
    import pyarrow.parquet as pq

    [row] = pq.read_table(out / "runs.parquet").to_pylist()
    assert (row["outcome"], row["reason"].split(":")[0]) == ("node_fail", "srun_step_launch_failed"), row


def squeue_reason(job_id: str) -> str:
    """Why slurmctld keeps a pending job waiting (squeue's %r)."""
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%r"], capture_output=True,
                          text=True, check=False).stdout.strip()
