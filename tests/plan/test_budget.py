"""The GPU-hour budget: estimates, what still fits under a cap, and when to ask first."""

from __future__ import annotations

import math

import pytest

from sweep.plan.budget import (
    CONFIRM_ABOVE_GPU_HOURS,
    STARTUP_S,
    RunCost,
    Spend,
    capped_worst,
    committed_gpu_hours,
    confirmation,
    estimate,
    expected_seconds,
    fit_budget,
)


def cost(run_id: str, gpus: int = 8, limit_h: float = 1.0, expected_h: float = 0.5) -> RunCost:
    return RunCost(run_id, gpus, limit_h * 3600, expected_h * 3600)


def test_expected_time_is_startup_plus_steps_at_the_predicted_step_time_never_above_the_limit(
) -> None:
    assert expected_seconds(1800, steps=20, step_time_s=2.0) == STARTUP_S + 40
    assert expected_seconds(100, steps=20, step_time_s=60.0) == 100  # capped at the limit
    for missing in (None, math.nan, 0.0, -1.0):  # no usable prediction: the limit
        assert expected_seconds(1800, steps=20, step_time_s=missing) == 1800
    assert expected_seconds(1800, steps=None, step_time_s=2.0) == 1800


def test_the_estimate_is_runs_times_gpus_times_time_and_the_worst_case_every_limit() -> None:
    found = estimate([cost("a", gpus=16, limit_h=1, expected_h=0.25),
                      cost("b", gpus=8, limit_h=2, expected_h=3.0)], predicted=1)
    assert found.expected_gpu_hours == pytest.approx(16 * 0.25 + 8 * 2)  # b capped at its limit
    assert found.worst_gpu_hours == pytest.approx(16 + 16)
    assert "1 from the plan's predicted step time" in found.describe()
    assert "worst case 32.00" in found.describe()


def test_committed_counts_in_flight_runs_at_their_time_limit_and_ended_ones_as_run() -> None:
    spends = [Spend(gpus=8, elapsed_s=1800, time_limit_s=3600, in_flight=False),
              Spend(gpus=8, elapsed_s=60, time_limit_s=3600, in_flight=True),
              Spend(gpus=8, elapsed_s=None, time_limit_s=3600, in_flight=True),  # pending
              Spend(gpus=8, elapsed_s=None, time_limit_s=3600, in_flight=False)]  # never ran
    assert committed_gpu_hours(spends) == pytest.approx(4 + 8 + 8)


def test_fit_budget_never_lets_spent_plus_in_flight_plus_chosen_exceed_the_cap() -> None:
    runs = [cost("a"), cost("b"), cost("c", gpus=16), cost("d", gpus=4)]
    fit = fit_budget(runs, committed_gpu_hours=10.0, cap_gpu_hours=30.0)
    # a (8) and b (8) fit: 26; c (16) would make 42; d (4) still fits: 30, exactly the cap.
    assert fit.chosen == ["a", "b", "d"] and fit.left_out == ["c"]
    assert fit_budget(runs, 31.0, 30.0).chosen == []  # over already: nothing more
    assert fit_budget(runs, 1e9, None).chosen == ["a", "b", "c", "d"]  # no cap


def test_a_large_worst_case_is_asked_about_and_refused_without_a_terminal() -> None:
    big = CONFIRM_ABOVE_GPU_HOURS + 1
    assert confirmation(CONFIRM_ABOVE_GPU_HOURS, yes=False, interactive=False) == "go"
    assert confirmation(big, yes=False, interactive=True) == "ask"
    assert confirmation(big, yes=False, interactive=False) == "refuse"
    assert confirmation(big, yes=True, interactive=False) == "go"
    assert capped_worst(5000.0, 800.0) == 800.0 and capped_worst(5000.0, None) == 5000.0
