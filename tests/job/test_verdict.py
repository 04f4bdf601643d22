"""Node verdicts and the run's status: node 0 decides over every node's observations and logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sweep.job.verdict import decide, log_text, merge_nodes, srun_node_failure

OOM_LINE = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 3 has a total capacity of 79.10 GiB of which 1.06 GiB is free.")
PEER_LINE = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
             "Connection closed by peer [10.0.0.2]:4242")


def observed(**fields: Any) -> dict[str, Any]:
    base = {"exit_code": 1, "launch_error": None, "signals": [], "hang": None, "last_step": 5,
            "summary_written": False, "cgroup_oom_kills": None}
    return {**base, **fields}


def node_record(k: int, obs: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": "r", "attempt": 1, "outcome": "?", "reason": "?", "rule": "?", "evidence": [],
            "last_step": obs["last_step"], "exit_codes": {f"node{k}": obs["exit_code"]},
            "signals": obs["signals"], "started_at": time.time() - 10, "ended_at": time.time(),
            "node": f"host{k}", "node_index": k, "writer": "watchdog", "observed": obs}


def write_log(attempt: Path, k: int, stream: str, text: str) -> None:
    (attempt / "logs").mkdir(exist_ok=True)
    (attempt / "logs" / f"node{k}.{stream}").write_text(text + "\n")


def test_an_oom_on_one_node_beats_the_lost_peer_it_causes_on_another(tmp_path: Path) -> None:
    write_log(tmp_path, 0, "err", PEER_LINE)
    write_log(tmp_path, 1, "err", OOM_LINE)
    own = node_record(0, observed())
    status = merge_nodes(tmp_path, own, {1: node_record(1, observed(last_step=4))}, 2, None)
    assert (status["outcome"], status["evidence"]) == ("oom", [OOM_LINE])
    assert status["exit_codes"] == {"node0": 1, "node1": 1}
    assert status["nodes"] == ["host0", "host1"] and status["last_step"] == 5


def test_a_hang_the_watchdog_saw_beats_the_crashes_its_sigterm_caused(tmp_path: Path) -> None:
    write_log(tmp_path, 1, "err", PEER_LINE)
    hang = {"phase": "step", "timeout_s": 300, "idle_s": 301, "last_step": 5}
    own = node_record(0, observed(exit_code=-15, hang=hang))
    status = merge_nodes(tmp_path, own, {1: node_record(1, observed())}, 2, None)
    assert (status["outcome"], status["reason"]) == ("hang", "no_progress_step")


def test_a_term_that_followed_another_nodes_failure_is_not_a_cancel(tmp_path: Path) -> None:
    write_log(tmp_path, 1, "err", "Traceback (most recent call last):\n"
              '  File "x.py", line 1, in <module>\nRuntimeError: rank 1 died')
    failed = node_record(1, observed())
    termed = node_record(0, observed(exit_code=-15, signals=["TERM"],
                                     signal_times=[failed["ended_at"] + 1]))
    status = merge_nodes(tmp_path, termed, {1: failed}, 2, None)
    assert (status["outcome"], status["evidence"], status["signals"]) == \
        ("crashed", ["RuntimeError: rank 1 died"], [])
    cancelled = node_record(0, observed(exit_code=-15, signals=["TERM"],
                                        signal_times=[time.time() - 60]))
    assert merge_nodes(tmp_path, cancelled, {1: failed}, 2, None)["outcome"] == "cancelled"


def test_a_node_without_a_file_is_a_node_failure_unless_slurm_stopped_the_job(
        tmp_path: Path) -> None:
    write_log(tmp_path, 0, "err", PEER_LINE)
    status = merge_nodes(tmp_path, node_record(0, observed()), {1: None}, 2, None)
    assert (status["outcome"], status["missing_nodes"]) == ("node_fail", ["node1"])
    assert status["evidence"][0] == "node1 wrote no node1.json"
    assert status["exit_codes"] == {"node0": 1, "node1": None}
    assert status["nodes"] == ["host0", None]
    timed_out = node_record(0, observed(exit_code=-15, signals=["USR1"]))
    assert merge_nodes(tmp_path, timed_out, {1: None}, 2, None)["outcome"] == "timeout"


def test_exit_0_short_of_the_step_budget_is_not_completed(tmp_path: Path) -> None:
    write_log(tmp_path, 0, "out", "bye")
    early = decide({0: observed(exit_code=0, last_step=3)}, log_text(tmp_path, [0]),
                   expected_steps=10)
    done = decide({0: observed(exit_code=0, last_step=10, summary_written=True)}, "",
                  expected_steps=10)
    assert early.outcome == "crashed" and done.outcome == "completed"


def test_a_cgroup_oom_kill_is_oom_even_without_a_log_line() -> None:
    verdict = decide({0: observed(exit_code=-9, cgroup_oom_kills=1)}, "", None)
    assert (verdict.outcome, verdict.reason) == ("oom", "cgroup_oom_kill")


def test_log_text_puts_stderr_before_stdout_and_skips_missing_files(tmp_path: Path) -> None:
    write_log(tmp_path, 0, "out", "out0")
    write_log(tmp_path, 0, "err", "err0")
    write_log(tmp_path, 2, "out", "out2")
    assert log_text(tmp_path, [0, 1, 2]) == "err0\n\nout0\n\nout2\n"


def test_srun_blaming_a_node_in_the_batch_stderr_makes_it_a_node_failure(tmp_path: Path) -> None:
    """A step that could not start on node2: node 0's watchdog got the step's TERM, and only
    srun's line in job.err (the batch script's stderr) says why. Its other lines stay out."""
    (tmp_path / "job.err").write_text(
        "srun: error: Task launch for StepId=2937.0 failed on node node2: Communication connection failure\n"
        "srun: error: Application launch failed: Communication connection failure\n"
        "slurmstepd-node1: error: *** STEP 2937.0 ON node1 CANCELLED AT 2026-11-23T22:53:35 ***\n")
    assert "CANCELLED" not in log_text(tmp_path, [0])
    own = node_record(0, observed(exit_code=-15, signals=["TERM"], last_step=None))
    status = merge_nodes(tmp_path, own, {1: None}, 2, None)
    assert (status["outcome"], status["reason"]) == ("node_fail", "srun_step_launch_failed"), status
    assert srun_node_failure(tmp_path) == ("srun_step_launch_failed", ("node2",))
