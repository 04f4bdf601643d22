"""sacct job and step states -> outcome, including the traps seen on the local Slurm cluster, and
srun's lines that blame a node.

The (job state, exit code, derived exit code, step states) combinations below are the ones recorded
in measurements on the local cluster for Slurm 22.05 (OOM inside srun, node failure, time limit, scancel).
"""

from __future__ import annotations

import pytest

from sweep.core.slurm_states import (
    node_failures_in_srun_output,
    normalize_state,
    outcome_from_sacct,
    outcome_from_sacct_row,
    parse_exit_code,
)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING", ""])
def test_unfinished_jobs_have_no_outcome(state):
    assert outcome_from_sacct(state) is None


def test_clean_completion():
    assert outcome_from_sacct("COMPLETED", "0:0", "0:0", ["COMPLETED", "COMPLETED"]) == ("completed", "slurm_completed")


def test_oom_in_srun_step_when_srun_was_the_last_command():
    # job FAILED 1:0, the step OUT_OF_MEMORY 0:125: the job state alone would say "crashed"
    outcome, reason = outcome_from_sacct("FAILED", "1:0", "0:125", ["FAILED", "OUT_OF_MEMORY"])
    assert outcome == "oom" and reason.startswith("slurm_step_out_of_memory")


def test_oom_in_srun_step_hidden_behind_a_completed_job():
    # another command ran after srun: the job is COMPLETED 0:0, only DerivedExitCode 0:125 tells
    assert outcome_from_sacct("COMPLETED", "0:0", "0:125")[0] == "oom"
    assert outcome_from_sacct("COMPLETED", "0:0", "0:0", ["COMPLETED", "OUT_OF_MEMORY"])[0] == "oom"


def test_oom_of_the_batch_step():
    assert outcome_from_sacct("OUT_OF_MEMORY", "0:125") == ("oom", "slurm_out_of_memory")


def test_node_failure_judged_by_the_job_row():
    # steps end CANCELLED 0:15, or COMPLETED when the batch host itself failed
    assert outcome_from_sacct("NODE_FAIL", "0:0", None, ["CANCELLED", "CANCELLED"]) == ("node_fail", "slurm_node_fail")
    assert outcome_from_sacct("NODE_FAIL", "0:0", None, ["COMPLETED"]) == ("node_fail", "slurm_node_fail")
    assert outcome_from_sacct("BOOT_FAIL")[0] == "node_fail"


def test_cancel_by_user_versus_node_failure():
    assert outcome_from_sacct("CANCELLED by 0", "0:15", None, ["CANCELLED"]) == ("cancelled", "slurm_cancelled")
    assert outcome_from_sacct("CANCELLED by 0", "0:15", None, ["NODE_FAIL", "CANCELLED"])[0] == "node_fail"


def test_time_limit_preemption_and_failures():
    assert outcome_from_sacct("TIMEOUT", "0:0", None, ["CANCELLED"]) == ("timeout", "slurm_time_limit")
    assert outcome_from_sacct("DEADLINE") == ("timeout", "slurm_deadline")
    assert outcome_from_sacct("PREEMPTED", "0:15") == ("preempted", "slurm_preempted")
    assert outcome_from_sacct("FAILED", "1:0") == ("crashed", "slurm_failed (exit code 1)")
    assert outcome_from_sacct("FAILED", "0:9") == ("crashed", "slurm_failed (signal SIGKILL)")
    assert outcome_from_sacct("COMPLETED", "0:0", "2:0") == ("crashed", "slurm_step_failed (exit code 2)")
    assert outcome_from_sacct("COMPLETED", "0:0", None, ["FAILED", "COMPLETED"])[0] == "crashed"


def test_sacct_spellings():
    assert normalize_state("CANCELLED+") == "CANCELLED"  # sacct truncates long states with '+'
    assert normalize_state(" cancelled by 1000 ") == "CANCELLED"
    assert outcome_from_sacct("CANCELLED+")[0] == "cancelled"
    assert parse_exit_code("0:125") == (0, 125) and parse_exit_code("") is None


def test_malformed_exit_code_names_the_field():
    with pytest.raises(ValueError, match="DerivedExitCode 'x:y'"):
        outcome_from_sacct("COMPLETED", "0:0", "x:y")


def test_a_sacct_row_with_its_steps():
    row = {"JobID": "12", "State": "FAILED", "ExitCode": "1:0", "DerivedExitCode": "0:125",
           "steps": [{"JobID": "12.batch", "State": "FAILED"}, {"JobID": "12.0", "State": "OUT_OF_MEMORY"}]}
    assert outcome_from_sacct_row(row)[0] == "oom"
    assert outcome_from_sacct_row({"State": "RUNNING"}) is None
    assert outcome_from_sacct_row({"state": "TIMEOUT", "step_states": ["CANCELLED"]}) == ("timeout", "slurm_time_limit")


def test_a_row_passed_as_the_state_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="outcome_from_sacct_row"):
        outcome_from_sacct({"State": "FAILED"})  # type: ignore[arg-type]


# srun's own lines, as printed by the local cluster (a node whose slurmd was killed) and as
# users pasted them from real clusters (aws/aws-parallelcluster#4179, snakemake/snakemake-executor-plugin-slurm#225)
LOCAL_LAUNCH_FAILURE = """\
srun: error: Task launch for StepId=2937.0 failed on node node2: Communication connection failure
srun: error: Application launch failed: Communication connection failure
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd-node1: error: *** STEP 2937.0 ON node1 CANCELLED AT 2026-11-23T22:53:35 ***
srun: error: node1: task 0: Killed
"""


def test_a_step_that_could_not_start_on_a_node_blames_that_node():
    assert node_failures_in_srun_output(LOCAL_LAUNCH_FAILURE) == ("srun_step_launch_failed", ("node2",))
    timed_out = "".join(f"srun: error: Task launch for StepId=20.0 failed on node compute-st-p4d-{n}: "
                        "Socket timed out on send/recv operation\n" for n in (41, 33, 41))
    assert node_failures_in_srun_output(timed_out) == ("srun_step_launch_failed",
                                                       ("compute-st-p4d-33", "compute-st-p4d-41"))
    old_format = "srun: error: Task launch for 73706.26 failed on node c002n0032: Communication connection failure"
    assert node_failures_in_srun_output(old_format) == ("srun_step_launch_failed", ("c002n0032",))


def test_a_node_failure_line_names_the_failed_node_first():
    text = "srun: error: Node failure on gpu07\n" + LOCAL_LAUNCH_FAILURE
    assert node_failures_in_srun_output(text) == ("srun_node_failure", ("gpu07",))


def test_launch_errors_of_the_job_itself_blame_no_node():
    layout = ("srun: error: Task launch for StepId=125452.4 failed on node gpu3: Unable to layout tasks on given "
              "cpus\nsrun: error: Application launch failed: Unable to layout tasks on given cpus\n")
    assert node_failures_in_srun_output(layout) is None
    assert node_failures_in_srun_output("srun: error: node1: task 0: Exited with exit code 3\n") is None
