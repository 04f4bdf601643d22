"""The round loop every search runs on (sweep.backends.base.Rounds), over the local backend's real
processes: a round is submit, then observe until none of it is in flight; a run queued twice is
adopted, not run twice; Ctrl-C in a round cancels what the backend has in flight."""

from __future__ import annotations

import _thread
import json
import signal
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import pytest

from sweep.backends.base import Rounds, Submitted
from sweep.backends.local import backend as local
from sweep.plan.budget import BudgetReached
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


class CappedCluster:
    """A backend whose runs each end at the next poll, having spent `spent_h` GPU-hours of the
    `upper_h` their time limit allows, under the one budget rule (sweep.plan.budget.fit_budget:
    spent + in flight at its limit + each new run at its limit ≤ cap)."""

    def __init__(self, cap_h: float, upper_h: float = 1.0, spent_h: float = 0.1) -> None:
        self.cap_h, self.upper_h, self.spent_h = cap_h, upper_h, spent_h
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.most_in_flight = 0

    def submit(self, run_dirs: Sequence[Path]) -> Submitted:
        from sweep.plan.budget import RunCost, fit_budget

        committed = len(self.done) * self.spent_h + len(self.running) * self.upper_h
        fit = fit_budget([RunCost(d.name, 1, self.upper_h * 3600, 0.0) for d in run_dirs],
                         committed, self.cap_h)
        self.running |= set(fit.chosen)
        self.most_in_flight = max(self.most_in_flight, len(self.running))
        return Submitted(launched=fit.chosen, left_out=fit.left_out, cap_gpu_hours=self.cap_h)

    def in_flight(self, run_ids: Collection[str]) -> set[str]:
        ending, self.running = self.running, set()
        self.done |= ending
        return set()

    def finished(self, run_dir: Path) -> bool:
        return run_dir.name in self.done

    def cancel(self) -> None:
        self.running.clear()


def test_under_a_cap_a_round_waits_for_room_and_the_later_rounds_go_on(tmp_path: Path) -> None:
    """One run fits at a time (cap 1.5, each run 1.0 at its limit): the first round's three runs
    go out one after the other, the second round's two too, never two at once; once what was
    spent leaves no room for one run even with nothing in flight, the cap ends the search."""
    cluster = CappedCluster(cap_h=1.5)
    rounds = Rounds(cluster, poll_s=0.0)
    rounds([tmp_path / r for r in ("a", "b", "c")])
    rounds([tmp_path / r for r in ("d", "e")])
    assert rounds.rounds == 2 and rounds.launched == ["a", "b", "c", "d", "e"]
    assert cluster.most_in_flight == 1
    with pytest.raises(BudgetReached) as stop:  # 5 × 0.1 spent: 0.5 + 1.0 still fits ...
        rounds([tmp_path / r for r in ("f", "g")])
    assert rounds.launched[5:] == ["f"] and stop.value.left_out == ["g"]  # ... 0.6 + 1.0 not
