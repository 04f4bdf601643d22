"""Nothing of a sweep depends on the login shell: real signals sent to a real `sweep submit`
process on the local cluster (scripts/local-slurm.sh start).

- SIGHUP to its process group (a dropped SSH session) while the preflight job runs: noted and
  ignored; the preflight's `sbatch --wait` is waited for, the driver starts, nothing is left.
- SIGTERM while the preflight job runs: the `sbatch --wait` is ended and its job cancelled; the
  sweep is shown half-submitted with the command that finishes it, and `sweep resume` restarts
  it as the search it was (its strategy was recorded at the submit's start).
- SIGHUP to a foreground search: it says why it stopped, and leaves its arrays with an afterany
  report job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sweep.backends.slurm.preflight import PREFLIGHT_DIR
from sweep.backends.slurm.submit_record import SUBMIT_LOG, read_submit
from sweep.cli import main
from sweep.core.state import read_jsonl
from sweep.search.driver import read_record
from tests.slurm_sweeps import job_path
from tests.specs import tiny_cpu_spec

__all__ = ["job_path"]  # a fixture

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def spec_of(tmp_path: Path, name: str) -> Path:
    """The tiny CPU sweep over two micro-batch sizes and two recomputation modes (4 runs)."""
    return tiny_cpu_spec(tmp_path / "spec.yaml", name,
                         axes={"mbs": [1, 2], "recompute": ["none", "full"]},
                         driver={"time_limit": "00:10:00", "mem": "400M"})


def start_submit(spec: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    """`sweep submit` as a login shell starts it: a process group of its own, as a terminal's
    foreground job is."""
    return subprocess.Popen([sys.executable, "-m", "sweep.cli", "submit", str(spec), "--out",
                             str(out), "--poll-s", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_phase(out: Path, phase: str, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while read_submit(out).get("phase") != phase:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"never reached {phase}: {read_submit(out)}; "
                                 f"{proc.communicate(timeout=30) if proc.poll() is not None else ''}")
        time.sleep(0.05)


def preflight_job(out: Path, timeout_s: float = 30) -> str:
    """The preflight job of this sweep (its output goes to the sweep's preflight/ folder)."""
    deadline = time.monotonic() + timeout_s
    folder = str((out / PREFLIGHT_DIR).resolve())
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "-h", "-n", "llm-sweep-preflight", "-o", "%i|%o"],
                                capture_output=True, text=True, check=False).stdout
        for line in listed.splitlines():
            job, _, output = line.partition("|")
            if output.startswith(folder):
                return job
        time.sleep(0.1)
    raise AssertionError(f"no preflight job writes to {folder}")


def sbatch_waits(out: Path) -> list[psutil.Process]:
    """The `sbatch --wait` processes of this sweep's preflight still alive."""
    script = str((out / PREFLIGHT_DIR).resolve())
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if "sbatch" in cmdline and "--wait" in cmdline and script in cmdline:
            found.append(process)
    return found


def status_of(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    return capsys.readouterr().out


def test_a_sighup_during_the_preflight_is_ignored_and_the_driver_starts(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    proc = start_submit(spec_of(tmp_path, sweep_name), out, "--strategy", "adaptive")
    wait_for_phase(out, "preflight", proc, timeout_s=60)
    preflight_job(out)  # the job is in the queue, sbatch --wait waits on it
    os.killpg(proc.pid, signal.SIGHUP)  # the whole foreground group, as a hang-up sends it
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "SIGHUP (the terminal went away) during preflight: ignored, going on" in stderr
    log = (out / SUBMIT_LOG).read_text()  # what a terminal that went away could not show
    assert "preflight passed" in log and "search driver: job" in log
    assert "search driver: job" in stdout  # and, to a terminal still there, as before
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left
        os.killpg(proc.pid, 0)
    assert not sbatch_waits(out)
    record = read_submit(out)
    assert record["phase"] == "done" and record["hangup"]["phase"] == "preflight"
    assert read_record(out)["options"]["strategy"] == "adaptive" and read_record(out)["job_id"]
    shown = status_of(out, capsys)
    assert "half-submitted" not in shown and f"search driver: job {read_record(out)['job_id']}" in shown


def test_a_sigterm_during_the_preflight_ends_its_job_and_resume_finishes_the_search(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    proc = start_submit(spec_of(tmp_path, sweep_name), out, "--strategy", "adaptive")
    wait_for_phase(out, "preflight", proc, timeout_s=60)
    job = preflight_job(out)
    proc.send_signal(signal.SIGTERM)  # the submitter alone: its child must not outlive it
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert (f"sweep submit: stopped by SIGTERM during preflight; `sweep resume {out}` finishes "
            "the sweep") in stderr
    assert not sbatch_waits(out)  # ended, not orphaned
    deadline = time.monotonic() + 30
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True,
                         check=False).stdout.strip():
        assert time.monotonic() < deadline, f"preflight job {job} still queued"
        time.sleep(0.5)
    assert not (out / "ledger.jsonl").exists() and not read_record(out).get("job_id")

    shown = status_of(out, capsys)
    assert "unsubmitted" in shown
    assert (f"half-submitted: sweep submit stopped during preflight by SIGTERM; "
            f"`sweep resume {out}` finishes it") in shown
    assert main(["resume", str(out), "--dry-run"]) == 0
    assert ("would submit a new adaptive search driver (the submit stopped before it started "
            "one)") in capsys.readouterr().out
    assert main(["resume", str(out)]) == 0  # the preflight again, then the driver
    printed = capsys.readouterr().out
    assert "preflight passed" in printed and "starts the search that its submit left" in printed
    record = read_record(out)
    assert record["job_id"] and record["options"]["strategy"] == "adaptive"
    shown = status_of(out, capsys)
    assert "half-submitted" not in shown and f"search driver: job {record['job_id']}" in shown


def test_a_sighup_stops_a_foreground_search_which_says_so_and_leaves_a_report_job(
        slurm_cluster: None, job_path: None, sweep_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    proc = start_submit(spec_of(tmp_path, sweep_name), out, "--strategy", "pruned",
                        "--foreground", "--no-preflight")
    deadline = time.monotonic() + 60
    while not any(r.get("job_id") for r in read_jsonl(out / "ledger.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)  # round 1's array is in the queue
    os.killpg(proc.pid, signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, stderr
    assert "sweep submit --foreground: stopped by SIGHUP during the pruned search; 1 array(s) " \
           "left running" in stderr, stderr
    report_job = read_record(out)["report_job"]
    assert f"report job {report_job} collects and reports after them" in stderr
    master = next(r["job_id"] for r in read_jsonl(out / "ledger.jsonl") if r.get("job_id"))
    dependency = subprocess.run(["squeue", "-h", "-j", report_job, "-o", "%E"],
                                capture_output=True, text=True, check=True).stdout
    assert f"afterany:{master}" in dependency, dependency
    assert "stopped by SIGHUP" in (out / SUBMIT_LOG).read_text()
    shown = status_of(out, capsys)
    assert "half-submitted: the foreground search stopped by SIGHUP; 1 array(s) left running" \
        in shown and f"`sweep resume {out}` finishes it" in shown
    assert main(["resume", str(out), "--dry-run"]) == 0  # the search, not plain arrays
    assert "would submit a new pruned search driver" in capsys.readouterr().out
