"""The local backend runs a run folder's job.sbatch the way Slurm would: real bash, real
processes, the srun/scontrol stand-ins on PATH, Slurm's environment, time limits and signals."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from sweep.backends.local import backend as local
from sweep.backends.local import scontrol, srun
from sweep.core import hostlist
from sweep.plan.render import render_runs
from sweep.plan.spec import parse_spec

SPEC = """
name: localtest
framework: builtin
gpu: cpu
gpus_per_node: 2
models: [tiny-4l]
nodes: [1, 2]
seq_len: 64
global_batch: {sequences: 8}
run: {steps: 4, warmup_steps: 1}
"""


def plan_row(nodes: int, mbs: int = 1) -> dict[str, object]:
    dp = 2 * nodes
    return {"model": "tiny-4l", "nodes": nodes, "dp": dp, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
            "mbs": mbs, "grad_acc": 8 // (dp * mbs), "zero_stage": 0, "vpp": 1,
            "recompute": "none", "sp": False, "pp_schedule": "1f1b"}


def run_with_script(tmp_path: Path, body: str, nodes: int = 1, mbs: int = 1,
                    directives: str = "") -> Path:
    """A rendered run whose job.sbatch is replaced by a small script under test."""
    [run_dir] = render_runs(parse_spec(SPEC), pd.DataFrame([plan_row(nodes, mbs)]), tmp_path)
    script = f"#!/bin/bash\n#SBATCH --nodes={nodes}\n{directives}set -euo pipefail\n"
    (run_dir / "job.sbatch").write_text(script + textwrap.dedent(body))
    return run_dir


def accounting(result: local.LocalResult) -> dict[str, object]:
    return json.loads((result.attempt_dir / local.ACCOUNTING_FILE).read_text())


# Pure pieces --------------------------------------------------------------------------------

def test_host_lists_expand_like_scontrol_show_hostnames() -> None:
    assert hostlist.expand("node[1-3,7],gpu01") == ["node1", "node2", "node3", "node7", "gpu01"]
    assert hostlist.expand("n[08-10]") == ["n08", "n09", "n10"]
    assert hostlist.expand("127.0.0.1,127.0.0.2") == ["127.0.0.1", "127.0.0.2"]
    with pytest.raises(ValueError):
        hostlist.expand("node[1-2")


def test_sbatch_directives_stop_at_the_first_command() -> None:
    script = ("#!/bin/bash\n# comment\n#SBATCH --nodes=2\n"
              "#SBATCH --time=00:01:00 --signal=B:USR1@30\necho hi\n#SBATCH --nodes=9\n")
    assert local.parse_directives(script) == {"nodes": "2", "time": "00:01:00",
                                              "signal": "B:USR1@30"}
    assert local.slurm_seconds("1-00:00:05") == 86405
    assert local.slurm_seconds("90") == 5400
    assert local.parse_signal("B:USR1@120") == (True, int(signal.SIGUSR1), 120)
    assert local.filename_pattern("/x/slurm-%j.%x.out", 42, "name", "n1") == "/x/slurm-42.name.out"


def test_the_srun_shim_gives_each_node_its_own_gpus() -> None:
    env = {srun.NODE_GPUS_ENV: "3,4;5,6", "CUDA_VISIBLE_DEVICES": "3,4"}
    nodes = ["127.0.0.1", "127.0.0.2"]
    assert [srun.task_env(env, nodes, i)["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["3,4", "5,6"]
    assert "CUDA_VISIBLE_DEVICES" not in srun.task_env({}, nodes, 1)


def test_srun_shim_refuses_what_it_cannot_emulate() -> None:
    env = {"SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.2", "SLURM_NNODES": "2"}
    assert srun.parse(["--kill-on-bad-exit=1", "-N", "2", "true"], env).kill_on_bad_exit
    with pytest.raises(srun.UsageError, match="one task per node"):
        srun.parse(["--ntasks-per-node=2", "true"], env)
    with pytest.raises(srun.UsageError, match="allocation has 2"):
        srun.parse(["--nodes=3", "true"], env)
    with pytest.raises(srun.UsageError, match="not emulated"):
        srun.parse(["--het-group=0", "true"], env)


def test_scontrol_shim_prints_the_node_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert scontrol.main(["show", "hostnames", "a[1-2]"]) == 0
    assert capsys.readouterr().out.split() == ["a1", "a2"]
    assert scontrol.main(["show", "jobs"]) == 1


# Whole jobs ---------------------------------------------------------------------------------

def test_a_two_node_job_gets_one_task_per_node_with_slurms_environment(tmp_path: Path) -> None:
    run_dir = run_with_script(tmp_path, """
        mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
        echo "master=${NODES[0]} job=$SLURM_JOB_ID attempt=$SWEEP_ATTEMPT_DIR"
        srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c \\
          'echo "$SLURM_NODEID $SLURM_PROCID $SLURMD_NODENAME $SLURM_NNODES" \\
             > "$SWEEP_ATTEMPT_DIR/task$SLURM_NODEID"'
        """, nodes=2)
    [result] = local.run_local([run_dir], slots=2)
    assert result.state == "COMPLETED" and result.exit_code == "0:0"
    tasks = sorted((result.attempt_dir / f"task{k}").read_text().split() for k in (0, 1))
    assert tasks == [["0", "0", "127.0.0.1", "2"], ["1", "1", "127.0.0.2", "2"]]
    out = (result.attempt_dir / f"slurm-{result.job_id}.out").read_text()
    assert f"master=127.0.0.1 job={result.job_id} attempt={result.attempt_dir}" in out
    assert result.attempt_dir == run_dir / "attempts" / "1"
    record = accounting(result)
    assert record["State"] == "COMPLETED" and record["NodeList"] == "127.0.0.1,127.0.0.2"


def test_a_failing_task_stops_the_others_and_the_job_fails(tmp_path: Path) -> None:
    run_dir = run_with_script(tmp_path, """
        srun --kill-on-bad-exit=1 bash -c \\
          'if [[ $SLURM_NODEID == 1 ]]; then exit 3; fi; sleep 60'
        """, nodes=2)
    started = time.monotonic()
    [result] = local.run_local([run_dir], slots=4)
    assert time.monotonic() - started < 30
    assert result.state == "FAILED" and result.exit_code != "0:0", result
    err = (result.attempt_dir / f"slurm-{result.job_id}.out").read_text()
    assert "127.0.0.2: task 1: Exited with exit code 3" in err


def test_the_time_limit_signals_the_batch_shell_then_ends_the_whole_job(tmp_path: Path) -> None:
    run_dir = run_with_script(tmp_path, """
        trap 'echo usr1 > "$SWEEP_ATTEMPT_DIR/got_usr1"' USR1
        srun bash -c 'setsid sleep 120 & echo $! > "$SWEEP_ATTEMPT_DIR/escaped"; sleep 120' &
        while true; do wait || true; done
        """, directives="#SBATCH --time=00:00:03\n#SBATCH --signal=B:USR1@2\n")
    [result] = local.LocalBackend(slots=2, kill_wait_s=1).run([run_dir])
    assert result.state == "TIMEOUT"
    assert (result.attempt_dir / "got_usr1").read_text() == "usr1\n"
    escaped = int((result.attempt_dir / "escaped").read_text())
    time.sleep(0.5)
    assert not psutil.pid_exists(escaped) or psutil.Process(escaped).status() == "zombie"
    err = (result.attempt_dir / f"slurm-{result.job_id}.out").read_text()
    assert "DUE TO TIME LIMIT" in err
    assert 3 <= result.elapsed_s < 15
    assert accounting(result)["State"] == "TIMEOUT"


def test_concurrency_is_capped_by_cpu_slots(tmp_path: Path) -> None:
    body = """
        date +%s.%N > "$SWEEP_ATTEMPT_DIR/start"; sleep 0.6; date +%s.%N > "$SWEEP_ATTEMPT_DIR/end"
        """
    runs = [run_with_script(tmp_path / str(k), body, mbs=m) for k, m in enumerate((1, 2, 4))]
    results = local.run_local(runs, slots=2, poll_s=0.05)  # each job needs 2 slots
    spans = sorted((float((r.attempt_dir / "start").read_text()),
                    float((r.attempt_dir / "end").read_text())) for r in results)
    assert len(spans) == 3 and all(r.state == "COMPLETED" for r in results)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"jobs overlapped: {spans}"


def gpu_run(tmp_path: Path, body: str, nodes: int = 1, mbs: int = 1) -> Path:
    """A run whose spec asks for GPUs (rendering needs none) and whose job.sbatch is `body`."""
    [run_dir] = render_runs(parse_spec(SPEC.replace("gpu: cpu", "gpu: h100-sxm")),
                            pd.DataFrame([plan_row(nodes, mbs)]), tmp_path)
    script = f"#!/bin/bash\n#SBATCH --nodes={nodes}\nset -euo pipefail\n"
    (run_dir / "job.sbatch").write_text(script + textwrap.dedent(body))
    return run_dir


def test_each_gpu_job_and_each_of_its_nodes_gets_gpus_of_its_own(tmp_path: Path) -> None:
    """On a GPU machine, jobs of two GPUs per node: an emulated node sees only its own GPUs
    (CUDA_VISIBLE_DEVICES, as under Slurm), jobs running at once never share one, and a job
    waits for free GPUs rather than CPU slots. The five "GPUs" are the ids the backend is given
    (what `sweep run` reads from CUDA_VISIBLE_DEVICES or nvidia-smi); nothing here touches one."""
    body = """
        srun bash -c 'echo "$(date +%s.%N) $SLURM_NODEID $CUDA_VISIBLE_DEVICES" \\
          >> "$SWEEP_ATTEMPT_DIR/gpus"; sleep 0.6; date +%s.%N > "$SWEEP_ATTEMPT_DIR/end$SLURM_NODEID"'
        """
    runs = [gpu_run(tmp_path / str(k), body, mbs=m) for k, m in enumerate((1, 2, 4))]
    runs.append(gpu_run(tmp_path / "two-node", body, nodes=2))
    backend = local.LocalBackend(slots=64, poll_s=0.05, gpus=["0", "1", "2", "3", "4"])
    results = backend.run(runs)
    assert sorted(r.state for r in results) == ["COMPLETED"] * 4
    spans = []
    for result in results:
        lines = [line.split() for line in (result.attempt_dir / "gpus").read_text().splitlines()]
        start = min(float(line[0]) for line in lines)
        end = max(float((result.attempt_dir / f"end{line[1]}").read_text()) for line in lines)
        devices = [set(line[2].split(",")) for line in lines]
        assert all(len(d) == 2 for d in devices)
        if len(devices) == 2:
            assert not devices[0] & devices[1], "two emulated nodes of one job share a GPU"
        spans.append((start, end, set().union(*devices)))
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
                   if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "with 5 GPUs two 2-GPU jobs should have run at once"
    for a, b in overlapping:
        assert not a[2] & b[2], f"jobs running at once shared a GPU: {a[2]} and {b[2]}"


def test_a_gpu_job_wider_than_the_machine_is_refused_naming_the_fix(tmp_path: Path) -> None:
    run_dir = gpu_run(tmp_path, "true\n", nodes=2)
    with pytest.raises(local.NotEnoughGpus, match=r"needs 4 GPUs \(2 node\(s\) × 2\), and this "
                                                  r"machine has 3; plan fewer nodes"):
        local.LocalBackend(gpus=["0", "1", "2"]).submit([run_dir])


def test_each_run_of_a_job_gets_a_new_attempt_folder(tmp_path: Path) -> None:
    run_dir = run_with_script(tmp_path, 'echo "$SWEEP_ATTEMPT" > "$SWEEP_ATTEMPT_DIR/n"\n')
    first = local.run_local([run_dir])[0]
    second = local.run_local([run_dir])[0]
    assert (first.attempt_dir.name, second.attempt_dir.name) == ("1", "2")
    assert (second.attempt_dir / "n").read_text() == "2\n"
    assert first.job_id != second.job_id


@pytest.mark.slow
def test_a_two_node_run_gets_one_watchdog_per_node_and_completes(tmp_path: Path) -> None:
    """The rendered job.sbatch, the emulated srun, two watchdogs, torchrun on each emulated node
    (static rendezvous at MASTER_ADDR:MASTER_PORT) and the built-in workload on 4 ranks."""
    [run_dir] = render_runs(parse_spec(SPEC), pd.DataFrame([plan_row(2)]), tmp_path)
    [result] = local.run_local([run_dir], slots=2)
    status = json.loads((result.attempt_dir / "status.json").read_text())
    assert (result.state, status["outcome"]) == ("COMPLETED", "completed"), status
    assert status["nodes"] == ["127.0.0.1", "127.0.0.2"]
    assert (result.attempt_dir / "node0.json").is_file()
    assert (result.attempt_dir / "node1.json").is_file()
    summary = json.loads((result.attempt_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["kind"] == "summary" and summary["world_size"] == 4
    env = json.loads((result.attempt_dir / "env.json").read_text())
    assert env["nodes"] == ["127.0.0.1", "127.0.0.2"]
    assert env["slurm_job_id"] == str(result.job_id)
    assert env["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert env["env"]["MASTER_PORT"] == str(20000 + result.job_id % 10000)
    assert env["harness"]["version"]
    assert os.path.islink(result.attempt_dir / "job.out")
    assert os.path.realpath(result.attempt_dir / "job.out") == str(
        run_dir / "attempts" / f"slurm-{result.job_id}.out")


def test_terminating_the_backend_cancels_its_jobs(tmp_path: Path) -> None:
    import subprocess
    import sys

    run_dir = run_with_script(tmp_path, """
        srun bash -c 'echo $$ > "$SWEEP_ATTEMPT_DIR/task_pid"; sleep 120'
        """)
    backend = subprocess.Popen([sys.executable, "-c", (
        "import sys; from sweep.backends.local import backend; "
        f"backend.LocalBackend(slots=2, kill_wait_s=1).run([{str(run_dir)!r}])")])
    pid_file = run_dir / "attempts" / "1" / "task_pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    task = int(pid_file.read_text())
    backend.send_signal(signal.SIGTERM)
    assert backend.wait(timeout=30) == 128 + signal.SIGTERM
    record = json.loads((run_dir / "attempts" / "1" / local.ACCOUNTING_FILE).read_text())
    assert record["State"] == "CANCELLED"
    time.sleep(0.3)
    assert not psutil.pid_exists(task) or psutil.Process(task).status() == "zombie"


def test_finished_runs_are_those_with_a_verdict_other_than_cancelled(tmp_path: Path) -> None:
    run_dir = run_with_script(tmp_path, "exit 0\n")
    assert not local.finished(run_dir)  # never started
    attempt = run_dir / "attempts" / "1"
    attempt.mkdir()
    assert not local.finished(run_dir)  # cut off with its runner: no record at all
    (attempt / local.ACCOUNTING_FILE).write_text(json.dumps({"State": "CANCELLED"}))
    assert not local.finished(run_dir)
    (attempt / local.ACCOUNTING_FILE).write_text(json.dumps({"State": "TIMEOUT"}))
    assert local.finished(run_dir)
    (attempt / "status.json").write_text(json.dumps({"outcome": "oom"}))
    assert local.finished(run_dir)
    (attempt / "status.json").write_text(json.dumps({"outcome": "cancelled"}))
    assert not local.finished(run_dir)
    [result] = local.run_local([run_dir])
    assert result.state == "COMPLETED" and local.finished(run_dir)


@pytest.mark.slow
def test_the_signal_before_the_time_limit_reaches_the_watchdogs(tmp_path: Path) -> None:
    """--signal=B:USR1@s from the rendered script: the backend signals the batch shell, which
    passes it through srun to the watchdog, which stops the run and calls it a timeout."""
    spec = parse_spec(SPEC.replace("run: {steps: 4, warmup_steps: 1}",
                                   'run: {steps: 100000, warmup_steps: 1, time_limit: "00:00:20", '
                                   "signal_before_s: 10, exclusive: false}"))
    [run_dir] = render_runs(spec, pd.DataFrame([plan_row(1)]), tmp_path)
    assert "#SBATCH --signal=B:USR1@10" in (run_dir / "job.sbatch").read_text()
    [result] = local.run_local([run_dir], slots=2)
    status = json.loads((result.attempt_dir / "status.json").read_text())
    assert status["outcome"] == "timeout" and "USR1" in status["signals"], status
    assert 10 <= result.elapsed_s < 20  # stopped after the signal, before the limit
