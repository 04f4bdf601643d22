"""The run-queue wait: what a CPU rank lost to other processes, counted by Linux per thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweep.workload.cpu_wait import thread_waits, waited_s

pytestmark = pytest.mark.skipif(thread_waits() is None, reason="this kernel keeps no schedstat")


def _spin(seconds: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass
    return time.perf_counter() - start


def test_a_thread_that_must_share_its_core_counts_the_time_it_waited() -> None:
    """One busy process per core beside us: we get at most about half a core, and the wait
    that Linux counts is the rest of the wall time."""
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                  for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)
        before = thread_waits()
        elapsed = _spin(1.0)
        waited = waited_s(before, thread_waits())
    finally:
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
    assert waited is not None
    assert 0.2 * elapsed < waited < elapsed


def test_a_thread_that_sleeps_is_not_waiting_for_a_core() -> None:
    """A blocked thread is not runnable: time spent in a collective's wait or a sleep is the
    run's own, and never counted as lost to others."""
    before = thread_waits()
    time.sleep(0.5)
    waited = waited_s(before, thread_waits())
    assert waited is not None and waited < 0.1


def test_the_wait_is_the_largest_of_any_thread_and_a_new_thread_counts_from_zero() -> None:
    before = {1: 1_000_000_000, 2: 5_000_000}
    after = {1: 1_200_000_000, 2: 305_000_000, 3: 50_000_000}
    assert waited_s(before, after) == pytest.approx(0.3)


def test_no_reading_no_wait() -> None:
    assert waited_s(None, {1: 5}) is None and waited_s({1: 5}, None) is None
