"""What `sweep status` says of a submit that did not reach its end, from the submit.json that
`SubmitSession` writes (the real signals are sent to a real `sweep submit` in
tests/commands/test_signals.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sweep.backends.slurm.submit_record import (
    Stopped,
    SubmitSession,
    describe_submit,
    read_submit,
)
from sweep.core.errors import UserError


def test_a_finished_submit_says_nothing_and_one_at_work_says_where(tmp_path: Path) -> None:
    with SubmitSession("submit") as session:
        session.attach(tmp_path, max_gpu_hours=2.0)
        session.enter("preflight")
        assert describe_submit(tmp_path) == f"sweep submit (pid {os.getpid()}) is at work: preflight"
        session.done()
    assert describe_submit(tmp_path) is None
    assert read_submit(tmp_path)["max_gpu_hours"] == 2.0


def test_a_stopped_a_failed_and_a_killed_submit_each_name_the_command_that_finishes_it(
        tmp_path: Path) -> None:
    with SubmitSession("submit") as session:
        session.attach(tmp_path)
        session.enter("submitting")
        session.stopped(Stopped(signal.SIGTERM))
    assert describe_submit(tmp_path) == (f"half-submitted: sweep submit stopped during submitting "
                                         f"by SIGTERM; `sweep resume {tmp_path}` finishes it")
    with SubmitSession("resume") as session:
        session.attach(tmp_path)
        session.enter("preflight")
        session.failed(UserError("preflight failed: no python3\nmore"))
    assert describe_submit(tmp_path) == (
        "half-submitted: sweep resume failed during preflight (preflight failed: no python3); "
        f"once that is fixed, `sweep resume {tmp_path}` finishes it")
    with SubmitSession("submit") as session:
        session.attach(tmp_path)
        session.enter("starting the driver")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    record = read_submit(tmp_path)
    (tmp_path / "submit.json").write_text(
        (tmp_path / "submit.json").read_text().replace(f'"pid": {record["pid"]}', f'"pid": {dead}'))
    assert describe_submit(tmp_path) == (
        "half-submitted: sweep submit ended during starting the driver without finishing "
        f"(killed?); `sweep resume {tmp_path}` finishes it")


def test_the_session_gives_back_the_signal_handlers_it_found(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    with SubmitSession("submit"):
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
    assert {s: signal.getsignal(s) for s in before} == before
