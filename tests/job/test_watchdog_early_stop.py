"""The watchdog ends a framework run at steady state: real launcher processes print real
Megatron iteration lines (the 2024 format of tests/fixtures/logs/megatron_steps_4.log) with the
step times a test chooses; nothing is mocked. The step times are in the lines, not the clock, so
the outcome does not depend on how loaded the machine is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.collect.attempts import collect_sweep
from sweep.job.watchdog import load_config
from tests.watchdog_runs import Run, kill_leftovers

RULE = {"window": 5, "max_cv": 0.05}
BUDGET = 40

# `megatron(times_ms)` prints one iteration line per time, 0.05 s apart, as Megatron's last rank
# does; on SIGTERM it dies the way a rank does when its peers go first (a lost-peer traceback,
# exit 1), so the errors our own SIGTERM causes are in the log.
MEGATRON = """
import signal
def lost_peer(signum, frame):
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "pretrain_gpt.py", line 1, in <module>', file=sys.stderr)
    print("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4321",
          file=sys.stderr, flush=True)
    os._exit(1)
signal.signal(signal.SIGTERM, lost_peer)
def megatron(times_ms):
    for step, ms in enumerate(times_ms, start=1):
        print(f" [2024-04-06 02:55:{step % 60:02d}] iteration {step:8d}/{len(times_ms):8d} | "
              f"consumed samples: {step * 128:12d} | elapsed time per iteration (ms): {ms:.1f} | "
              f"throughput per GPU (TFLOP/s/GPU): 231.9 | learning rate: 4.000000E-07 | "
              f"global batch size:   128 | lm loss: 2.021530E+00 | loss scale: 1.0 | grad norm: 6.895 | "
              f"number of skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
        time.sleep(0.05)
"""

# torchtitan logs tokens/s per device, no step time (tests/fixtures/logs/torchtitan_steps_3.log).
TORCHTITAN = """
def torchtitan(tps):
    for step, rate in enumerate(tps, start=1):
        print(f"[rank0]:[titan] 2025-03-12 11:10:{step % 60:02d},511 - root - INFO - step: {step}  "
              f"loss:  6.2250  memory:  1.41GiB(1.79%)  tps: {rate:,}  tflops: 18.36  mfu: 1.86%", flush=True)
        time.sleep(0.05)
"""


def megatron_run(root: Path, **settings: object) -> Run:
    return Run(root, framework="megatron", steps=BUDGET, warmup_steps=3, early_stop=RULE, **settings)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    made = megatron_run(tmp_path)
    yield made
    kill_leftovers(made)


def test_steady_step_times_end_the_run_completed_by_steady_state(run: Run) -> None:
    # warm-up 9 s, 7 s, 6 s; then 5.00 s +- 0.5 %: steady once 5 post-warm-up steps are in (step 8)
    times = [9000, 7000, 6000] + [5000 + 25 * (-1) ** i for i in range(BUDGET - 3)]
    done = run.supervise(run.python(MEGATRON + f"megatron({times})"))
    status = run.status
    assert (done.returncode, status["outcome"], status["rule"], status["reason"]) == \
        (0, "completed", "steady_state", "steady_state"), done.stderr
    assert status["ended_by"] == "steady_state"
    assert "CV" in status["evidence"][0] and "over the last 5 step times (steps 4..8)" in status["evidence"][0]
    window = status["observed"]["steady_state"]
    assert (window["window"], window["max_cv"], window["first_step"], window["last_step"]) == (5, 0.05, 4, 8)
    assert window["cv"] < 0.05
    assert status["exit_codes"] == {"node0": 1}  # it died of our SIGTERM: still completed
    assert status["last_step"] < BUDGET
    (stopped,) = run.events("stopped")
    assert stopped["terminated"] and not stopped["killed"] and not stopped["survivors"]
    (row,) = collect_sweep(run.root).table.to_pylist()
    assert (row["outcome"], row["rule"], row["ended_by"]) == ("completed", "steady_state", "steady_state")


def test_torchtitan_step_times_come_from_its_tokens_per_second(tmp_path: Path) -> None:
    run = Run(tmp_path, framework="torchtitan", steps=BUDGET, warmup_steps=3, early_stop=RULE)
    try:
        tps = [90_000, 150_000, 180_000] + [200_000 + 500 * (-1) ** i for i in range(BUDGET - 3)]
        done = run.supervise(run.python(TORCHTITAN + f"torchtitan({tps})"))
    finally:
        kill_leftovers(run)
    status = run.status
    assert (status["outcome"], status["rule"], status["ended_by"]) == ("completed", "steady_state", "steady_state"), \
        done.stderr
    assert status["observed"]["steady_state"]["last_step"] == 8


def test_step_times_that_vary_wildly_run_to_the_step_budget(run: Run) -> None:
    times = [500 if i % 2 else 2000 for i in range(BUDGET)]
    done = run.supervise(run.python(MEGATRON + f"megatron({times})"))
    status = run.status
    assert (done.returncode, status["outcome"], status["rule"]) == (0, "completed", "clean_exit"), done.stderr
    assert status["ended_by"] == "step_budget" and status["last_step"] == BUDGET
    assert status["observed"]["steady_state"] is None and not run.events("steady_state")
    (row,) = collect_sweep(run.root).table.to_pylist()
    assert (row["outcome"], row["ended_by"], row["last_step"]) == ("completed", "step_budget", BUDGET)


def test_a_window_that_turns_steady_only_at_the_budget_was_ended_by_the_budget(run: Run) -> None:
    times = [500 if i % 2 else 2000 for i in range(BUDGET - 5)] + [5000] * 5
    done = run.supervise(run.python(MEGATRON + f"megatron({times})"))
    status = run.status
    assert (status["outcome"], status["rule"], status["ended_by"]) == ("completed", "clean_exit", "step_budget"), \
        done.stderr
    assert not run.events("steady_state")


def test_a_failure_already_logged_is_not_turned_into_a_steady_stop(run: Run) -> None:
    """One rank ran out of memory; the last rank's lines, steady, come before the launcher exits."""
    code = MEGATRON + f"""
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr, flush=True)
megatron({[5000] * 12})
sys.exit(1)
"""
    done = run.supervise(run.python(code))
    status = run.status
    assert (status["outcome"], status["ended_by"], status["exit_codes"]) == ("oom", None, {"node0": 1}), done.stderr
    assert status["last_step"] == 12 and not run.events("steady_state")


def test_every_node_stops_at_the_same_step_and_node0_says_steady_state(tmp_path: Path) -> None:
    run = megatron_run(tmp_path, nodes=2)
    times = [9000, 7000, 6000] + [5000] * (BUDGET - 3)
    env = {"SLURM_NNODES": "2"}
    try:
        # Megatron logs from the last rank: node 1 prints the lines, node 0 prints nothing.
        node1 = run.start(run.python(MEGATRON + f"megatron({times})\ntime.sleep(300)"),
                          env={**env, "SLURM_NODEID": "1", "SLURMD_NODENAME": "n1"})
        node0 = run.start(run.python(MEGATRON + "time.sleep(300)"), "--node-wait-s", "20",
                          env={**env, "SLURM_NODEID": "0", "SLURMD_NODENAME": "n0"})
        node0.communicate(timeout=60)
        node1.communicate(timeout=60)
    finally:
        kill_leftovers(run)
    status = run.status
    assert (status["outcome"], status["rule"], status["ended_by"]) == ("completed", "steady_state", "steady_state")
    assert status["missing_nodes"] == [] and status["nodes"] == ["n0", "n1"]
    stops = {e["node"]: e["last_step"] for e in run.events("steady_state")}
    assert stops == {0: 8, 1: 8}
    assert (node0.returncode, node1.returncode) == (0, 0)


def test_the_builtin_workload_stops_itself_and_a_bad_rule_is_a_clear_error(tmp_path: Path) -> None:
    builtin = Run(tmp_path / "b", early_stop=RULE)
    assert load_config(builtin.run_dir, builtin.attempt, ["true"]).early_stop is None
    megatron = megatron_run(tmp_path / "m")
    assert load_config(megatron.run_dir, megatron.attempt, ["true"]).early_stop is not None
    bad = Run(tmp_path / "x", framework="megatron", early_stop={"window": 5})
    done = bad.supervise(["true"])
    assert done.returncode == 2
    assert "settings.early_stop.max_cv: Field required" in done.stderr


def test_a_run_file_that_names_no_known_framework_is_a_clear_error(tmp_path: Path) -> None:
    """The adapter says whether a run stops itself; a run.json whose framework no adapter knows
    (edited by hand, or from a newer llm-sweep) is refused by name before anything launches."""
    unknown = Run(tmp_path / "u", framework="deepspeed")
    done = unknown.supervise(["true"])
    assert done.returncode == 2
    assert "run.json: unknown framework 'deepspeed'" in done.stderr
    assert "render the run again" in done.stderr
