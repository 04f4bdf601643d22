"""The outcome classifier on real failure logs, on bare evidence, and on the order of its rules.

Real logs: tests/fixtures/logs/fail_*.log (see the README there; the #SOURCE header lines are
metadata and are dropped before classifying). Lines written inline below are constructed and say so.
NCCL, ProcessGroupNCCL, gloo and c10d store messages of every supported version: tests/fixtures/
collective_failures.yaml, each built from its source's format string and citing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep.job.classify import (
    OUTCOMES,
    RULES,
    Evidence,
    classify,
    exit_signal,
    rule_table,
    scan_log_for_failures,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
COLLECTIVE_FAILURES = Path(__file__).resolve().parents[1] / "fixtures" / "collective_failures.yaml"


def log_body(name: str) -> str:
    return "".join(line for line in (FIXTURES / name).open() if not line.startswith("#SOURCE:"))


# fixture -> (outcome, reason, rule, a piece of the first evidence line)
REAL_LOGS = {
    "fail_cuda_oom_1.log": ("oom", "cuda_oom", "cuda_oom", "Tried to allocate 1.06 GiB. GPU 4"),
    "fail_cuda_oom_2.log": ("oom", "cuda_oom", "cuda_oom", "GPU 6 has a total capacty of 79.33 GiB"),
    "fail_cuda_oom_3.log": ("oom", "cuda_oom", "cuda_oom", "[rank15]: torch.OutOfMemoryError"),
    "fail_cpu_alloc_oom_1.log": ("oom", "cpu_alloc_oom", "cpu_oom", "you tried to allocate 132426121216 bytes"),
    "fail_cpu_alloc_oom_2.log": ("oom", "cpu_alloc_oom", "cpu_oom", "DefaultCPUAllocator: not enough memory"),
    "fail_cgroup_oom_1.log": ("oom", "cgroup_oom_kill", "cgroup_oom", "Detected 1 oom-kill event(s) in StepId=13466817.0"),
    "fail_cgroup_oom_2.log": ("oom", "cgroup_oom_kill", "cgroup_oom", "Detected 1 oom_kill event in StepId=440575.0"),
    "fail_illegal_memory_access_1.log": ("crashed", "illegal_memory_access", "illegal_memory_access",
                                         "an illegal memory access was encountered"),
    "fail_illegal_memory_access_2.log": ("crashed", "illegal_memory_access", "illegal_memory_access",
                                         "torch.AcceleratorError: CUDA error: an illegal memory access"),
    "fail_nccl_timeout_1.log": ("hang", "nccl_watchdog_timeout", "collective_timeout", "OpType=_ALLGATHER_BASE"),
    "fail_nccl_timeout_2.log": ("hang", "nccl_watchdog_timeout", "collective_timeout", "[Rank 3] Watchdog caught"),
    "fail_nccl_timeout_3.log": ("hang", "nccl_watchdog_timeout", "collective_timeout", "[rank4]:[E ProcessGroupNCCL"),
    "fail_gloo_timeout_1.log": ("hang", "gloo_timeout", "collective_timeout", "Timed out waiting 1800000ms for send"),
    "fail_slurm_time_limit_1.log": ("timeout", "slurm_time_limit", "slurm_time_limit", "*** JOB 1999618 ON r6i4n5"),
    "fail_slurm_time_limit_2.log": ("timeout", "slurm_time_limit", "slurm_time_limit", "*** STEP 1999616.0 ON r6i4n5"),
    "fail_slurm_time_limit_3.log": ("timeout", "slurm_time_limit", "slurm_time_limit", "*** STEP 1809655.0 ON r6i4n3"),
    "fail_slurm_time_limit_4.log": ("timeout", "slurm_time_limit", "slurm_time_limit", "*** JOB 494583 ON ..."),
    "fail_slurm_node_fail_1.log": ("node_fail", "slurm_node_failure", "slurm_node_failure", "Node failure on jean-zay-iam37"),
    "fail_slurm_node_fail_2.log": ("node_fail", "slurm_node_failure", "slurm_node_failure", "Node failure on jean-zay-iam49"),
    "fail_slurm_preemption_1.log": ("preempted", "slurm_preempted", "slurm_preemption", "DUE TO PREEMPTION"),
    "fail_slurm_preemption_2.log": ("preempted", "slurm_preempted", "slurm_preemption", "this job is preempted"),
    "fail_slurm_cancelled_1.log": ("cancelled", "slurm_cancelled", "slurm_cancelled", "*** STEP 6053.0 ON DEL2212S020"),
    "fail_slurm_cancelled_2.log": ("cancelled", "slurm_cancelled", "slurm_cancelled", "*** STEP 1809577.0 ON r6i5n1"),
    "fail_segfault_1.log": ("crashed", "segfault", "segfault", "exitcode  : -11 (pid: 6421)"),
    "fail_segfault_2.log": ("crashed", "segfault", "segfault", "Caught signal 11 (Segmentation fault"),
    "fail_sigkill_1.log": ("crashed", "sigkill", "killed_by_sigkill", "exitcode  : -9 (pid: 3309)"),
    "fail_sigkill_2.log": ("crashed", "sigkill", "killed_by_sigkill", "failed (exitcode: -9) local_rank: 2"),
    "fail_nccl_error_1.log": ("crashed", "nccl_error", "nccl_error", "NCCL error: remote process exited"),
    "fail_nccl_error_2.log": ("crashed", "nccl_error", "nccl_error", "unhandled system error, NCCL version 2.7.8"),
    "fail_cuda_unknown_error_1.log": ("crashed", "cuda_error", "cuda_error", "[default3]:terminate called"),
    "fail_cuda_unknown_error_2.log": ("crashed", "cuda_error", "cuda_error", "c10::CUDAError"),
    "fail_cuda_ecc_error_1.log": ("node_fail", "gpu_ecc_error", "gpu_hardware_error", "cudaErrorECCUncorrectable"),
    # the edge case: "CUDA error: out of memory" at the first barrier, on a faulty GPU, before any step
    "fail_cuda_ecc_error_2.log": ("crashed", "cuda_runtime_oom_before_first_step", "cuda_runtime_oom",
                                  "RuntimeError: CUDA error: out of memory"),
    "fail_childfailederror_1.log": ("crashed", "child_failed", "child_failed", "ChildFailedError"),
    "fail_childfailederror_2.log": ("crashed", "child_failed", "child_failed", "Root Cause (first observed failure)"),
    "fail_childfailederror_3.log": ("crashed", "child_failed", "child_failed", "failed (exitcode: 1) local_rank: 0"),
    # four ranks raise; torchrun names rank 1 as the root cause, so rank 1's exception line is the evidence
    "fail_childfailederror_4.log": ("crashed", "python_exception:AttributeError", "python_exception",
                                    "[rank1]: AttributeError: 'NoneType' object has no attribute 'shape'"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL_LOGS))
def test_real_failure_logs(name):
    outcome, reason, rule, evidence = REAL_LOGS[name]
    verdict = classify(Evidence(log_text=log_body(name)))
    assert (verdict.outcome, verdict.reason, verdict.rule) == (outcome, reason, rule)
    assert evidence in verdict.evidence_lines[0]
    assert all(line in log_body(name) for line in verdict.evidence_lines)  # exact log lines


# Output of real torchrun runs of WORKER on this project's machine (torch 2.13.0+cpu, gloo), kept as fixtures.
GENERATED_LOGS = {
    "gen_gloo_rank_raises.log": ("crashed", "python_exception:ValueError", "python_exception",
                                 "[rank1]: ValueError: injected failure at step 2"),
    "gen_gloo_rank_cpu_oom.log": ("oom", "cpu_alloc_oom", "cpu_oom",
                                  "[rank1]: RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
                                  "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes."),
}

WORKER = """\
import resource, sys, torch, torch.distributed as dist
mode = sys.argv[1]
dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.ones(4)
for step in range(1, 4):
    if step == 2 and r == 1:
        if mode == "raise":
            raise ValueError("injected failure at step 2")
        if mode == "oom":
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
            x = torch.empty(8 << 30, dtype=torch.uint8)
    dist.all_reduce(t)
    print(f"rank {r} step {step}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("name", sorted(GENERATED_LOGS))
def test_generated_gloo_failure_logs(name):
    outcome, reason, rule, evidence = GENERATED_LOGS[name]
    verdict = classify(Evidence(log_text=log_body(name), exit_codes={"node0": 1}, last_step=1))
    assert (verdict.outcome, verdict.reason, verdict.rule) == (outcome, reason, rule)
    assert verdict.evidence_lines[0].startswith(evidence)


@pytest.mark.slow
def test_a_real_rank_past_its_address_space_limit_is_oom(tmp_path):
    """Real processes: torchrun, 2 gloo ranks; rank 1 allocates past RLIMIT_AS (the watchdog's OOM check)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", "localhost:0", str(script), "oom"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    verdict = classify(Evidence(log_text=run.stdout + run.stderr, exit_codes={"node0": run.returncode}))
    assert run.returncode == 1
    assert (verdict.outcome, verdict.reason, verdict.rule) == ("oom", "cpu_alloc_oom", "cpu_oom")
    assert "DefaultCPUAllocator: can't allocate memory" in verdict.evidence_lines[0]


def test_every_real_failure_fixture_is_covered():
    on_disk = {p.name for p in FIXTURES.glob("fail_*.log")}
    assert on_disk == set(REAL_LOGS)


def test_illegal_memory_access_under_memory_pressure_is_not_oom():
    # the log also holds "expandable_segments: memory mapping failed with OOM" warnings
    text = log_body("fail_illegal_memory_access_1.log")
    assert "memory mapping failed with OOM" in text
    assert not [f for f in scan_log_for_failures(text) if f.outcome == "oom"]


def test_runtime_cuda_oom_after_training_started_is_oom():
    verdict = classify(Evidence(log_text="RuntimeError: CUDA error: out of memory\n", last_step=12))
    assert (verdict.outcome, verdict.reason) == ("oom", "cuda_runtime_oom")


# ---------------------------------------------------------------- evidence without logs


def test_clean_exit_is_completed_and_early_exit_is_not():
    assert classify(Evidence(exit_codes={"node0": 0, "node1": 0})).outcome == "completed"
    early = classify(Evidence(exit_codes={"node0": 0}, last_step=3, expected_steps=10))
    assert (early.outcome, early.reason, early.rule) == ("crashed", "exited_early", "exited_early")
    done = classify(Evidence(exit_codes={"node0": 0}, last_step=7, expected_steps=10, summary_written=True))
    assert done.outcome == "completed"  # ended by the steady-state policy: the summary says so


def test_exit_0_after_being_stopped_is_not_completed():
    assert classify(Evidence(exit_codes={"node0": 0}, hang_killed=True, last_step=2)).outcome == "hang"
    assert classify(Evidence(exit_codes={"node0": 0}, signals=("USR1",))).outcome == "timeout"
    finished = classify(Evidence(exit_codes={"node0": 0}, signals=("USR1",), summary_written=True))
    assert finished.outcome == "completed"  # the signal came after the summary: the work was done


def test_a_caught_oom_does_not_fail_a_run_that_exited_cleanly():
    log = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"  # constructed
    assert classify(Evidence(exit_codes={"node0": 0}, log_text=log)).outcome == "completed"


def test_watchdog_hang_before_and_after_the_first_step():
    startup = classify(Evidence(hang_killed=True, exit_codes={"node0": -15}))
    assert (startup.outcome, startup.reason, startup.rule) == ("hang", "no_progress_startup", "watchdog_hang")
    stepping = classify(Evidence(hang_killed=True, last_step=4, exit_codes={"node0": -9}))
    assert stepping.reason == "no_progress_step" and "after step 4" in stepping.evidence_lines[-1]


def test_signals_received_by_the_watchdog():
    assert classify(Evidence(signals=("USR1",), exit_codes={"node0": -15})).outcome == "timeout"
    assert classify(Evidence(signals=("SIGTERM",), exit_codes={"node0": -15})).outcome == "cancelled"
    assert classify(Evidence(time_limit_hit=True)).reason == "time_limit_signal"


def test_exit_codes_alone():
    assert exit_signal(-9) == 9 and exit_signal(137) == 9 and exit_signal(1) is None and exit_signal(0) is None
    sigkill = classify(Evidence(exit_codes={"node0": 137}))
    assert (sigkill.outcome, sigkill.reason, sigkill.rule) == ("crashed", "sigkill", "signal_exit")
    assert classify(Evidence(exit_codes={"node0": 0, "node1": 2})).reason == "exit_code_2"
    assert classify(Evidence()).rule == "no_evidence"


def test_sigkill_with_an_oom_kill_record_is_oom():
    verdict = classify(Evidence(exit_codes={"node0": -9}, oom_kill_count=1))
    assert (verdict.outcome, verdict.reason, verdict.rule) == ("oom", "cgroup_oom_kill", "cgroup_oom")


def test_sacct_decides_when_slurm_killed_the_job():
    # no status.json: only accounting (notes/local-slurm.md cases)
    assert classify(Evidence(slurm_state="TIMEOUT", slurm_exit_code="0:0")).outcome == "timeout"
    hidden_oom = classify(Evidence(slurm_state="COMPLETED", slurm_exit_code="0:0", derived_exit_code="0:125"))
    assert (hidden_oom.outcome, hidden_oom.rule) == ("oom", "cgroup_oom")
    step_oom = classify(Evidence(slurm_state="FAILED", slurm_exit_code="1:0", step_states=("FAILED", "OUT_OF_MEMORY")))
    assert step_oom.outcome == "oom" and "OUT_OF_MEMORY" in step_oom.evidence_lines[0]
    assert classify(Evidence(slurm_state="NODE_FAIL", exit_codes={"node0": -15})).outcome == "node_fail"
    assert classify(Evidence(slurm_state="CANCELLED by 0")).outcome == "cancelled"
    assert classify(Evidence(slurm_state="COMPLETED", slurm_exit_code="0:0")).outcome == "completed"
    assert classify(Evidence(slurm_state="FAILED", slurm_exit_code="1:0")).rule == "slurm_accounting"
    # exit 0 on every node but sacct says the job timed out: not completed
    assert classify(Evidence(exit_codes={"node0": 0}, slurm_state="TIMEOUT")).outcome == "timeout"


# ---------------------------------------------------------------- which cause wins


def test_oom_outranks_the_hang_it_caused():
    log = log_body("fail_cuda_oom_3.log")
    assert classify(Evidence(log_text=log, hang_killed=True, last_step=3)).outcome == "oom"


def test_node_failure_outranks_the_cuda_errors_it_caused():
    verdict = classify(Evidence(log_text=log_body("fail_slurm_node_fail_2.log"), exit_codes={"node0": -6}))
    assert verdict.outcome == "node_fail"


def test_time_limit_outranks_the_sigterms_it_caused():
    verdict = classify(Evidence(log_text=log_body("fail_slurm_time_limit_1.log"), exit_codes={"node0": -15}))
    assert verdict.outcome == "timeout"


def test_the_raising_rank_outranks_the_peers_that_lost_it():
    # constructed: what two gloo ranks print when rank 1 raises and rank 0 waits in all_reduce
    log = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/work/main/sweep/workload/train.py", line 80, in step\n'
        "[rank0]:     dist.all_reduce(t)\n"
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/work/main/sweep/workload/train.py", line 77, in step\n'
        '[rank1]:     raise ValueError("injected failure at step 3")\n'
        "[rank1]: ValueError: injected failure at step 3\n"
    )
    verdict = classify(Evidence(log_text=log, exit_codes={"node0": 1}))
    assert (verdict.outcome, verdict.reason) == ("crashed", "python_exception:ValueError")
    assert verdict.evidence_lines == ("[rank1]: ValueError: injected failure at step 3",)


def test_scan_reports_lines_in_log_order():
    findings = scan_log_for_failures(log_body("fail_slurm_time_limit_2.log"))
    assert [f.rule for f in findings] == ["slurm_time_limit", "slurm_time_limit"]
    assert findings[0].line.startswith("slurmstepd: error: *** STEP 1999616.0")
    assert scan_log_for_failures("") == [] and scan_log_for_failures("\x00\xff\n|||") == []


def test_scan_keeps_a_bounded_number_of_lines():
    many = "[E ProcessGroupNCCL.cpp:457] [Rank 3] Watchdog caught collective operation timeout\n" * 500
    assert len(scan_log_for_failures(many)) == 20


def test_rule_table_is_well_formed():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.outcome for r in RULES} <= set(OUTCOMES)
    assert rule_table()[0] == {"rule": "slurm_node_failure", "outcome": "node_fail",
                               "description": RULES[0].description}
    assert names[-1] == "no_evidence"


def test_a_launcher_that_never_started():
    verdict = classify(Evidence(launch_error="[Errno 2] No such file or directory: 'torchrun'", exit_codes={"node0": 127}))
    assert (verdict.outcome, verdict.reason, verdict.rule) == ("crashed", "launcher_failed_to_start", "launch_failed")


# constructed one-liners, one per pattern reason, in the wording each pattern was written for
ONE_LINERS = {
    "slurm_node_failure": "srun: error: Node failure on node2",
    "srun_step_launch_failed": "srun: error: Task launch for StepId=2937.0 failed on node node2: "
                               "Communication connection failure",
    "gpu_ecc_error": "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "slurm_preempted": "slurmstepd: error: *** JOB 7 ON node1 CANCELLED AT 2026-11-22T07:00:00 DUE TO PREEMPTION ***",
    "slurm_requeued": "slurmstepd: error: *** JOB 7 ON node1 CANCELLED AT 2026-11-22T07:00:00 DUE TO JOB REQUEUE ***",
    "illegal_memory_access": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "launch_refused": "llm-sweep: cannot launch: nanotron version check: found nanotron @ e24d2483 "
                      "(supported as 'playbook-e24d2483', not the 'main' this run was rendered for)",
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    "cublas_alloc_failed": "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "nccl_cuda_oom": "node1:1:2 [0] NCCL WARN Cuda failure 'out of memory'",
    "cuda_runtime_oom": "RuntimeError: CUDA error: out of memory",
    "cpu_alloc_oom": "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.",
    "python_memory_error": "MemoryError",
    "host_enomem": "OSError: [Errno 12] Cannot allocate memory",
    "cgroup_oom_kill": "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.batch.",
    "slurm_memory_limit": "slurmstepd: error: StepId=54.batch exceeded memory limit (163708928 > 104857600), being killed",
    "nccl_watchdog_timeout": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE)",
    "nccl_work_timeout": "[rank0]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at "
                         "NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
    "nccl_watchdog_abort": "[rank3]:[E626 16:48:25.440250129 ProcessGroupNCCL.cpp:684] [Rank 3] Some NCCL operations "
                           "have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
                           "GPU operations might run on corrupted/incomplete data.",
    "gloo_timeout": "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv operation",
    "slurm_time_limit": "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-11-22T07:00:00 DUE TO TIME LIMIT ***",
    "slurm_cancelled": "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-11-22T07:00:00 ***",
    "segfault": "Segmentation fault (core dumped)",
    "nccl_error": "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8",
    "cuda_error": "RuntimeError: CUDA error: unspecified launch failure",
    "sigabrt": "Fatal Python error: Aborted",
    "sigkill": "  traceback : Signal 9 (SIGKILL) received by PID 3309",
    "peer_connection_lost": "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4242",
    "child_failed": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "nccl_heartbeat_timeout": "[PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping "
                              "debug info. workMetaList_.size()=103",
    "nccl_warn": "node1:1:2 [0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer node2<4242>",
    "nccl_comm_aborted": "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 2. ",
    "store_wait_for_clients": "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
                              "1/2 clients joined.",
    "store_wait_timeout": "torch.distributed.DistStoreError: Socket Timeout",
    "connect_timeout": "torch.distributed.DistNetworkError: The client socket has timed out after 120000ms while "
                       "trying to connect to (node1, 29500).",
    "nccl_nonblocking_timeout": "torch.distributed.DistBackendError: NCCL timeout in: NCCLUtils.cpp:190",
    "nccl2_timeout": "[TC][rank=1][name=0] Operation timed out after 600027 ms",
    "nccl_abort_timeout": "[PG ID 0 PG GUID 0 Rank 2] Future for ProcessGroup abort timed out after 600000 ms",
    "nccl_peer_error": "[PG ID 0 PG GUID 0(default_pg) Rank 5]  remote error detected from rank: 3",
}


@pytest.mark.parametrize("reason", sorted(ONE_LINERS))
def test_each_pattern_is_found_past_the_keyword_filter(reason):
    assert reason in {f.reason for f in scan_log_for_failures(ONE_LINERS[reason] + "\n")}


def test_every_pattern_reason_has_a_one_liner():
    from sweep.job.classify import PATTERNS

    assert {p.reason for p in PATTERNS} == set(ONE_LINERS)


# ---------------------------------------------------------------- early stop at steady state

STEADY = {"window": 5, "cv": 0.004, "max_cv": 0.02, "first_step": 4, "last_step": 8}


def test_a_watchdog_steady_stop_is_completed_whatever_its_own_sigterm_caused():
    # constructed: what a rank prints when the watchdog's SIGTERM takes its peers first
    log = "[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4321\n"
    for code in (-15, 1, 143):
        verdict = classify(Evidence(exit_codes={"node0": code}, log_text=log, last_step=8, steady_state=STEADY))
        assert (verdict.outcome, verdict.reason, verdict.rule) == ("completed", "steady_state", "steady_state")
    assert verdict.evidence_lines == ("watchdog: step times steady, CV 0.004 < 0.02 over the last 5 step times "
                                      "(steps 4..8); stopped the process tree",)


def test_slurm_failures_outrank_a_steady_stop():
    node_fail = Evidence(log_text=log_body("fail_slurm_node_fail_2.log"), exit_codes={"node0": -15}, steady_state=STEADY)
    assert classify(node_fail).outcome == "node_fail"
    assert classify(Evidence(slurm_state="PREEMPTED", steady_state=STEADY)).outcome == "preempted"


# PyTorch's own wording of an NCCL watchdog abort with no "Watchdog caught" line, as pasted in
# snowflakedb/ArcticTraining#219 (torch 2.7, 2025-06): ranks say the collective failed or timed
# out and take the process down; no NCCL error names another cause.
NCCL_WATCHDOG_ABORT = """\
[rank5]:[E626 16:48:25.440238649 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 120049 PG status: last enqueued work: 120051, last completed work: 120048
[rank3]:[E626 16:48:25.440250129 ProcessGroupNCCL.cpp:684] [Rank 3] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank3]:[E626 16:48:25.440271515 ProcessGroupNCCL.cpp:698] [Rank 3] To avoid data inconsistency, we are taking the entire process down.
"""


def test_an_nccl_watchdog_abort_without_the_timeout_line_is_a_hang_not_a_plain_crash():
    verdict = classify(Evidence(log_text=NCCL_WATCHDOG_ABORT, exit_codes={"node0": -6}, last_step=40))
    assert (verdict.outcome, verdict.rule) == ("hang", "nccl_watchdog_abort")
    assert any("Some NCCL operations have failed" in line for line in verdict.evidence_lines)


def test_an_nccl_error_beside_the_abort_lines_names_the_cause():
    error = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8\n"
    verdict = classify(Evidence(log_text=NCCL_WATCHDOG_ABORT + error, exit_codes={"node0": 1}))
    assert (verdict.outcome, verdict.rule) == ("crashed", "nccl_error")


# ---------------------------------------------------------------- every NCCL / gloo / c10d failure wording
# tests/fixtures/collective_failures.yaml: each message built from its source's format string (repository,
# file and version or commit cited there), embedded in a real torchrun log of a rank that aborted or raised.

def _collective_corpus() -> dict[str, Any]:
    with COLLECTIVE_FAILURES.open(encoding="utf-8") as handle:
        corpus: dict[str, Any] = yaml.safe_load(handle)
    return corpus


COLLECTIVE_CORPUS = _collective_corpus()
COLLECTIVE_MESSAGES = {entry["id"]: entry for entry in COLLECTIVE_CORPUS["messages"]}


def _in_torchrun_log(entry: dict[str, Any]) -> str:
    """The entry's lines where a real rank printed them: before dying of SIGABRT, or as the exception it raised.

    ProcessGroupNCCL's watchdog and NCCL take the process down (std::terminate, LOG(FATAL)): the `abort`
    context; c10d store, socket and gloo errors, and NCCL errors on the main thread, are raised: `raise`.
    """
    context = "raise" if "exception" in entry else "abort"
    text = COLLECTIVE_CORPUS["contexts"][context]
    log = entry.get("log")
    text = text.replace("@@LOG@@", log) if log else text.replace("@@LOG@@\n", "")
    if context == "raise":
        text = text.replace("@@EXCEPTION@@", entry["exception"])
    assert "@@" not in text
    return text + "\n"


def test_the_collective_corpus_cites_a_source_for_every_message():
    for entry in COLLECTIVE_CORPUS["messages"]:
        source = entry["source"]
        # upstream, or a fork's copy of a PyTorch release line no tagged upstream file of which was readable
        assert source["repo"] in {"pytorch/pytorch", "NVIDIA/nccl", "facebookincubator/gloo", "eqy/pytorch",
                                  "jataylo/pytorch", "hexinw-nvidia/pytorch", "cyyever/pytorch"}, entry["id"]
        assert source["path"] and str(source["ref"]) and entry["format"], entry["id"]
        assert entry["expect"]["outcome"] in OUTCOMES, entry["id"]
        assert entry.get("log") or entry.get("exception"), entry["id"]
    assert len(COLLECTIVE_MESSAGES) == len(COLLECTIVE_CORPUS["messages"])  # ids are unique


@pytest.mark.parametrize("message_id", sorted(COLLECTIVE_MESSAGES))
def test_collective_failure_messages_in_a_torchrun_log(message_id):
    entry = COLLECTIVE_MESSAGES[message_id]
    exit_code = 1 if "exception" in entry else -6
    text = _in_torchrun_log(entry)
    verdict = classify(Evidence(log_text=text, exit_codes={"node0": exit_code}, last_step=41))
    expect = entry["expect"]
    assert (verdict.outcome, verdict.rule, verdict.reason) == (expect["outcome"], expect["rule"], expect["reason"])
    assert verdict.evidence_lines and all(line in text for line in verdict.evidence_lines)
    # the evidence is the entry's own line, not the launcher's summary around it
    assert verdict.evidence_lines[0] in (entry.get("log") or "") + (entry.get("exception") or "")


@pytest.mark.parametrize("ordinary", COLLECTIVE_CORPUS["ordinary"], ids=lambda o: o["source"][:60])
def test_lines_of_healthy_runs_are_no_failure(ordinary):
    assert scan_log_for_failures(ordinary["line"] + "\n") == []


def test_healthy_lines_do_not_turn_a_rank_exception_into_an_nccl_failure():
    benign = "".join(o["line"] + "\n" for o in COLLECTIVE_CORPUS["ordinary"])
    raised = _in_torchrun_log({"exception": "ValueError: injected failure at step 41"})
    verdict = classify(Evidence(log_text=benign + raised, exit_codes={"node0": 1}, last_step=41))
    assert (verdict.outcome, verdict.reason) == ("crashed", "python_exception:ValueError")
    clean = classify(Evidence(log_text=benign, exit_codes={"node0": 0}, last_step=41, expected_steps=41))
    assert clean.outcome == "completed"


def test_a_peer_that_died_first_outranks_the_rank_that_waited_for_it():
    # constructed: a store timeout on rank 0 because rank 1 raised before it joined; rank 1's error is the cause
    waited = _in_torchrun_log(COLLECTIVE_MESSAGES["pt24_store_wait_for_clients"])
    died = "[rank1]: ImportError: cannot import name 'flash_attn_func' from 'flash_attn'\n"
    text = waited.replace("Traceback (most recent call last):", "[rank1]: Traceback (most recent call last):\n"
                          "[rank1]:   File \"/tmp/ctxgen/train.py\", line 2, in <module>\n" + died.rstrip("\n")
                          + "\nTraceback (most recent call last):", 1)
    verdict = classify(Evidence(log_text=text, exit_codes={"node0": 1}))
    assert (verdict.outcome, verdict.reason) == ("crashed", "python_exception:ImportError")
    alone = classify(Evidence(log_text=waited, exit_codes={"node0": 1}))
    assert (alone.outcome, alone.rule) == ("hang", "rendezvous_timeout")


@pytest.mark.parametrize("dump_id", ["pt24_dump_signal_from_this_rank", "pt25_dump_signal_from_this_rank",
                                     "pt28_dump_signal_from_this_rank"])
def test_an_nccl_error_outranks_the_debug_dump_that_followed_it(dump_id):
    # ProcessGroupNCCL signals its flight-recorder dump ("due to a collective timeout" from 2.5 on) after an
    # NCCL error too (dumpOnException_, dumpOnTimeoutOrEx_): the error line, not the dump's wording, is the cause
    error = COLLECTIVE_MESSAGES["nccl227_connection_closed_by_remote_peer"]["log"]
    dump = COLLECTIVE_MESSAGES[dump_id]["log"]
    verdict = classify(Evidence(log_text=_in_torchrun_log({"log": error + "\n" + dump}), exit_codes={"node0": -6}))
    assert (verdict.outcome, verdict.rule, verdict.reason) == ("crashed", "nccl_error", "nccl_warn")
