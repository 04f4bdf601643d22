"""The round loop every search runs on (sweep.backends.base.Rounds), over the local backend's real
processes: a round is submit, then observe until none of it is in flight; a run queued twice is
adopted, not run twice; Ctrl-C in a round cancels what the backend has in flight."""

from __future__ import annotations

import _thread
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweep.backends.base import Rounds
from sweep.backends.local import backend as local
from tests.backends.local.test_backend import run_with_script

QUICK = "echo start; sleep 0.3; echo done\n"


def test_a_round_runs_its_batch_to_the_end_and_counts_what_it_launched(tmp_path: Path) -> None:
    runs = [run_with_script(tmp_path / f"s{i}", QUICK) for i in range(2)]
    backend = local.LocalBackend(slots=4, kill_wait_s=1)
    rounds = Rounds(backend, poll_s=0.05)
    with backend.session():
        rounds(runs)
    assert rounds.rounds == 1 and sorted(rounds.launched) == sorted(r.name for r in runs)
    assert all(backend.finished(r) for r in runs)
    assert not backend.in_flight({r.name for r in runs})
    rounds([])  # an empty round asks nothing
    assert rounds.rounds == 1


def test_a_run_already_in_flight_is_adopted_not_run_again(tmp_path: Path) -> None:
    run = run_with_script(tmp_path, QUICK)
    backend = local.LocalBackend(slots=2, kill_wait_s=1)
    with backend.session():
        first = backend.submit([run])
        again = backend.submit([run])
        while backend.in_flight({run.name}):
            time.sleep(0.05)
    assert (first.launched, first.adopted) == ([run.name], [])
    assert (again.launched, again.adopted) == ([], [run.name])
    assert len(local.attempt_dirs(run)) == 1


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, as in a terminal, even where the test process was
    started in the background: a shell without job control starts it with SIGINT ignored, and
    then `_thread.interrupt_main` does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_an_interrupted_round_cancels_what_is_in_flight(tmp_path: Path) -> None:
    run = run_with_script(tmp_path, "echo start; sleep 60\n")
    backend = local.LocalBackend(slots=2, kill_wait_s=1)
    rounds = Rounds(backend, poll_s=0.05)
    stop = threading.Timer(1.0, _thread.interrupt_main)  # Ctrl-C, one second in
    with pytest.raises(KeyboardInterrupt), backend.session():
        stop.start()
        rounds([run])
    [attempt] = local.attempt_dirs(run)
    record = json.loads((attempt / local.ACCOUNTING_FILE).read_text())
    assert record["State"] == "CANCELLED"
    assert not backend.in_flight({run.name})
