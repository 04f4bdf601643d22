"""The submission rules without a cluster: shapes, arrays, the ledger, run states, bad nodes."""

from __future__ import annotations

import itertools

import pytest

from sweep.backends.slurm.submission import (
    AttemptView,
    Batch,
    NodeExclusions,
    NodeFailure,
    NodeRecord,
    RunJob,
    RunState,
    SlurmView,
    Submission,
    SubmissionError,
    TaskRef,
    array_option,
    bad_nodes,
    batch_in,
    change_exclusions,
    combine,
    expand_task_ids,
    job_comment,
    latest_tasks,
    node_records,
    plan_batches,
    reconcile,
    resumable,
    run_state,
    shape_of,
    shape_options,
    split_arrays,
    submissions,
    update_exclusions,
)

TWO_NODES = {"job-name": "s.a", "nodes": "2", "time": "00:10:00", "output": "/r/a/slurm-%j.out",
             "error": "/r/a/slurm-%j.err", "no-requeue": "", "signal": "B:USR1@60"}


def ids() -> object:
    counter = itertools.count()
    return lambda: f"b{next(counter)}"


def test_shape_ignores_names_and_files_only() -> None:
    other_run = {**TWO_NODES, "job-name": "s.b", "output": "/r/b/o", "error": "/r/b/e"}
    assert shape_of(TWO_NODES) == shape_of(other_run)
    assert shape_of(TWO_NODES) != shape_of({**TWO_NODES, "time": "00:20:00"})
    assert shape_of(TWO_NODES) != shape_of({**TWO_NODES, "mem": "64G"})
    assert dict(shape_of(TWO_NODES)) == {"nodes": "2", "time": "00:10:00", "no-requeue": "",
                                         "signal": "B:USR1@60"}


def test_short_options_are_refused_with_the_fix() -> None:
    with pytest.raises(SubmissionError, match="long form"):
        shape_of({"N": "", "2": ""}, "runs/a/job.sbatch")


def test_shape_options_merge_the_bad_nodes_into_the_exclude_list() -> None:
    shape = shape_of({**TWO_NODES, "exclude": "gpu[01-02]"})
    options = shape_options(shape, exclude=["node7", "node3"])
    assert "--exclude=gpu[01-02],node3,node7" in options
    assert "--no-requeue" in options and "--nodes=2" in options
    assert not any(o.startswith("--exclude") for o in shape_options(shape_of(TWO_NODES)))
    already = shape_of({**TWO_NODES, "exclude": "node3,node7"})
    assert "--exclude=node3,node7" in shape_options(already, exclude=["node7"])


def test_runs_of_one_shape_share_an_array_in_first_seen_order() -> None:
    small, big = shape_of(TWO_NODES), shape_of({**TWO_NODES, "nodes": "8"})
    runs = [RunJob("a", small), RunJob("b", big), RunJob("c", small)]
    batches, left = plan_batches(runs, max_array_size=1001, capacity=100, new_id=ids())
    assert [(b.shape, b.run_ids) for b in batches] == [(small, ("a", "c")), (big, ("b",))]
    assert left == []


def test_arrays_split_so_that_no_index_reaches_max_array_size() -> None:
    chunks = split_arrays([str(i) for i in range(2503)], max_array_size=1001)
    assert [len(c) for c in chunks] == [1001, 1001, 501]  # highest index 1000 < 1001
    with pytest.raises(SubmissionError, match="disabled"):
        split_arrays(["a"], 0)


def test_4000_runs_under_max_array_size_5001_are_one_sbatch() -> None:
    runs = [RunJob(f"r{i}", shape_of(TWO_NODES)) for i in range(4000)]
    batches, _ = plan_batches(runs, max_array_size=5001, capacity=20000, new_id=ids())
    assert [len(b.run_ids) for b in batches] == [4000]


def test_capacity_under_the_job_limits_leaves_runs_for_later() -> None:
    runs = [RunJob(f"r{i}", shape_of(TWO_NODES)) for i in range(10)]
    batches, left = plan_batches(runs, max_array_size=4, capacity=6, new_id=ids())
    assert [len(b.run_ids) for b in batches] == [4, 2]
    assert left == [f"r{i}" for i in range(6, 10)]
    assert plan_batches(runs, 4, capacity=-5, new_id=ids()) == ([], [r.run_id for r in runs])


def test_array_option_throttles_only_when_it_limits() -> None:
    assert array_option(10, 3) == "--array=0-9%3"
    assert array_option(10, None) == "--array=0-9"
    assert array_option(2, 5) == "--array=0-1"


def test_the_batch_id_is_read_back_from_comments_and_submit_lines() -> None:
    comment = job_comment("my-sweep", "4563a1ff")
    assert batch_in(comment) == "4563a1ff"
    assert batch_in(f"sbatch --parsable --array=0-3 --comment={comment} x.sh") == "4563a1ff"
    assert batch_in("(null)") is None and batch_in("") is None


def _ledger() -> list[dict]:
    return [
        {"event": "intent", "batch": "b1", "run_ids": ["a", "b"], "time": 10.0},
        {"event": "submitted", "batch": "b1", "job_id": "100"},
        {"event": "intent", "batch": "b2", "run_ids": ["c"], "time": 11.0},  # killed before sbatch
        {"event": "intent", "batch": "b3", "run_ids": ["d"], "time": 12.0},  # killed after sbatch
        {"event": "intent", "batch": "b4", "run_ids": ["e"], "time": 13.0},
        {"event": "failed", "batch": "b4", "error": "Batch job submission failed"},
    ]


def test_ledger_reconciliation_settles_intents_from_what_slurm_knows() -> None:
    subs = submissions(_ledger())
    assert [s.batch_id for s in subs if s.job_id is None and s.failed is None] == ["b2", "b3"]
    records = reconcile(subs, seen={"b3": "103", "b1": "100"})
    assert records == [{"event": "reconciled", "batch": "b2", "job_id": None},
                       {"event": "reconciled", "batch": "b3", "job_id": "103"}]
    settled = submissions([*_ledger(), *records])
    latest = latest_tasks(settled)
    # b3 reached Slurm: its run counts as submitted; b2 and the refused b4 did not.
    assert {run: task.task_id for run, task in latest.items()} == {"a": "100_0", "b": "100_1",
                                                                   "d": "103_0"}
    assert reconcile(settled, {}) == []  # nothing left to settle: idempotent


def test_a_later_batch_supersedes_and_a_torn_line_is_ignored() -> None:
    subs = submissions([*_ledger(), {"event": "intent", "batch": "b5", "run_ids": ["a"], "time": 20},
                        {"event": "submitted", "batch": "b5", "job_id": "200"}])
    assert latest_tasks(subs)["a"] == TaskRef("200", 0, 20.0)


def test_array_task_ids_expand_ranges_and_throttles() -> None:
    assert expand_task_ids("12_3") == ("12", [3])
    assert expand_task_ids("12_[0-2,7%4]") == ("12", [0, 1, 2, 7])
    assert expand_task_ids("12") is None and expand_task_ids("12_3.batch") is None


TASK = TaskRef("100", 1, 1000.0)


def test_live_tasks_are_in_flight_whatever_the_files_say() -> None:
    old = AttemptView(1, "timeout")
    state = run_state("a", TASK, SlurmView("PENDING", live=True, reason="JobHeldUser"), old, 1001)
    assert (state.state, state.reason, state.in_flight) == ("pending", "JobHeldUser", True)
    assert run_state("a", TASK, SlurmView("RUNNING", live=True), None, 1001).state == "running"


def test_an_oom_inside_an_srun_step_is_oom_though_the_job_failed() -> None:
    view = SlurmView("FAILED", live=False, exit_code="1:0", step_states=("COMPLETED", "OUT_OF_MEMORY"))
    assert run_state("a", TASK, view, AttemptView(1, "crashed"), 1001).state == "oom"
    assert run_state("a", TASK, view, None, 1001).state == "oom"


def test_slurm_kills_beat_a_watchdog_that_only_saw_a_signal() -> None:
    assert combine("cancelled", ("node_fail", "slurm_node_fail"))[0] == "node_fail"
    assert combine("crashed", ("timeout", "slurm_time_limit"))[0] == "timeout"
    assert combine("hang", ("cancelled", "slurm_cancelled"))[0] == "hang"
    assert combine("completed", ("completed", "slurm_completed")) == ("completed", "status.json")
    assert combine(None, None) is None


def test_a_cancelled_pending_task_has_no_attempt_and_is_cancelled() -> None:
    state = run_state("a", TASK, SlurmView("CANCELLED", live=False, exit_code="0:0"), None, 1001)
    assert state.state == "cancelled"


def test_without_an_attempt_folder_the_nodes_come_from_slurm_host_list() -> None:
    view = SlurmView("NODE_FAIL", live=False, exit_code="0:0", nodes="node[1-2],gpu[07,09]")
    assert run_state("a", TASK, view, None, 1001).nodes == ("node1", "node2", "gpu07", "gpu09")


def test_no_word_from_slurm_is_in_flight_at_first_then_lost() -> None:
    assert run_state("a", TASK, None, None, 1001).state == "submitted"
    assert run_state("a", TASK, None, None, 1000 + 3600).state == "lost"
    sacct_lag = SlurmView("PENDING", live=False)
    assert run_state("a", TASK, sacct_lag, None, 5000).state == "submitted"


def test_runs_without_a_submission_are_unsubmitted_or_their_local_outcome() -> None:
    assert run_state("a", None, None, None, 0).state == "unsubmitted"
    assert run_state("a", None, None, AttemptView(2, "completed"), 0).state == "completed"


def _states(**by_state: list[str]) -> list:
    return [RunState(run_id=run, state=state) for state, runs in by_state.items() for run in runs]


def test_resume_selects_failures_and_never_in_flight_or_completed() -> None:
    states = _states(completed=["c"], oom=["o"], timeout=["t"], node_fail=["n"], running=["r"],
                     pending=["p"], submitted=["s"], unsubmitted=["u"], cancelled=["x"])
    assert sorted(resumable(states, None)) == ["n", "t", "u", "x"]
    assert resumable(states, ["oom", "timeout"]) == ["o", "t"]
    assert resumable(states, ["completed", "running", "pending"]) == []


def test_a_node_joins_the_exclude_list_at_two_failures() -> None:
    failures = [NodeFailure("a", 1, "node_fail", ("node2",)),
                NodeFailure("b", 1, "nccl", ("node2", "node3")),
                NodeFailure("c", 1, "node_fail", ("node3",)),
                NodeFailure("c", 1, "node_fail", ("node4",)),  # the same attempt seen twice
                NodeFailure("c", 1, "node_fail", ("node4",))]
    assert bad_nodes(failures) == {"node2": 2, "node3": 2}
    assert bad_nodes(failures[:1]) == {}


def test_a_node_excluded_then_taken_out_by_hand_is_forgiven_its_old_failures() -> None:
    old = [(NodeFailure("a", 1, "node_fail", ("node2",)), 10.0), (NodeFailure("b", 1, "nccl", ("node2",)), 20.0)]
    first = update_exclusions(NodeExclusions(), old, now=30.0)
    assert first.exclude == ("node2",) and first.excluded_at == {"node2": 30.0} and first.forgiven_at == {}
    assert update_exclusions(first, old, now=40.0) == first  # nothing new: nothing changes

    by_hand = NodeExclusions((), first.excluded_at, first.forgiven_at)  # `exclude` emptied in the file
    forgiven = update_exclusions(by_hand, old, now=50.0)
    assert forgiven.exclude == () and forgiven.forgiven_at == {"node2": 50.0} and forgiven.excluded_at == {}

    one_more = old + [(NodeFailure("c", 1, "node_fail", ("node2",)), 60.0)]
    assert update_exclusions(forgiven, one_more, now=70.0).exclude == ()
    two_more = one_more + [(NodeFailure("d", 1, "node_fail", ("node2",)), 80.0)]
    again = update_exclusions(forgiven, two_more, now=90.0)
    assert again.exclude == ("node2",) and again.excluded_at == {"node2": 90.0}


def test_a_node_put_into_exclude_by_hand_stays_excluded() -> None:
    mine = update_exclusions(NodeExclusions(("node9",)), [], now=5.0)
    assert mine.exclude == ("node9",) and mine.excluded_at == {"node9": 5.0}


def test_forgiving_by_command_is_forgiving_by_hand() -> None:
    old = [(NodeFailure("a", 1, "node_fail", ("node2",)), 10.0), (NodeFailure("b", 1, "nccl", ("node2",)), 20.0)]
    excluded = update_exclusions(NodeExclusions(), old, now=30.0)
    by_command = change_exclusions(excluded, forgive=["node2"], now=50.0)
    by_hand = update_exclusions(NodeExclusions((), excluded.excluded_at, excluded.forgiven_at), old, now=50.0)
    assert by_command == by_hand == NodeExclusions((), {}, {"node2": 50.0})
    assert update_exclusions(by_command, old, now=60.0) == by_command


def test_excluding_by_command_keeps_the_first_exclusion_time() -> None:
    first = change_exclusions(NodeExclusions(), exclude=["n2", "n1"], now=5.0)
    assert first == NodeExclusions(("n1", "n2"), {"n1": 5.0, "n2": 5.0}, {})
    assert change_exclusions(first, exclude=["n1", "n3"], now=9.0).excluded_at == {"n1": 5.0, "n2": 5.0, "n3": 9.0}


def test_node_records_count_every_failure_and_those_since_forgiven() -> None:
    failures = [(NodeFailure("a", 1, "node_fail", ("n2", "n3")), 10.0),
                (NodeFailure("a", 1, "nccl", ("n2",)), 10.0),  # the same attempt: counted once
                (NodeFailure("b", 2, "nccl", ("n2",)), 40.0)]
    exclusions = NodeExclusions(("n9",), {"n9": 1.0}, {"n2": 30.0})
    assert node_records(exclusions, failures) == [
        NodeRecord("n2", failures=2, counted=1, excluded_at=None, forgiven_at=30.0),
        NodeRecord("n3", failures=1, counted=1, excluded_at=None, forgiven_at=None),
        NodeRecord("n9", failures=0, counted=0, excluded_at=1.0, forgiven_at=None)]
    assert node_records(exclusions, failures)[2].excluded_by_hand()


def test_batches_are_plain_data() -> None:
    batch = Batch("b1", shape_of(TWO_NODES), ("a",))
    assert batch.run_ids == ("a",) and Submission("b1", ("a",), 1.0).job_id is None


def test_one_slurmd_death_that_ends_two_jobs_is_one_incident_of_its_node() -> None:
    """Two jobs on node2 ended within seconds (its slurmd died): one failure of node2, so it
    stays in use; a second incident an hour later excludes it."""
    same_death = [NodeFailure("a", 1, "node_fail", ("node2",), ended_at=1000.0),
                  NodeFailure("b", 1, "node_fail", ("node2",), ended_at=1003.0)]
    assert bad_nodes(same_death) == {}
    later = same_death + [NodeFailure("c", 1, "node_fail", ("node2",), ended_at=4600.0)]
    assert bad_nodes(later) == {"node2": 2}
    unknown = [NodeFailure("a", 1, "node_fail", ("node3",)), NodeFailure("b", 1, "nccl", ("node3",))]
    assert bad_nodes(unknown) == {"node3": 2}  # without end times each counts


def test_forgiving_keeps_the_end_times_that_group_incidents() -> None:
    same_death = [(NodeFailure("a", 1, "node_fail", ("node2",), ended_at=1000.0), 2000.0),
                  (NodeFailure("b", 1, "node_fail", ("node2",), ended_at=1002.0), 2000.0)]
    assert update_exclusions(NodeExclusions(), same_death, now=2001.0).exclude == ()
