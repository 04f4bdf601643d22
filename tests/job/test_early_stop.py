"""The steady-state rule that ends runs early: one pure function for the workload and the watchdog."""

from __future__ import annotations

import math

import pytest

from sweep.job.early_stop import EarlyStop, coefficient_of_variation, last_window, steady_window

RULE = EarlyStop(window=4, max_cv=0.05)


def numbered(times: list[float], first: int = 1) -> list[tuple[int, float]]:
    return list(enumerate(times, start=first))


def test_steady_when_the_cv_of_the_last_window_is_under_the_threshold() -> None:
    window = steady_window(numbered([3.0, 1.0, 1.01, 0.99, 1.0, 1.02]), RULE, warmup_steps=0)
    assert window is not None and window.steady
    assert (window.first_step, window.last_step, window.window) == (3, 6, 4)
    assert window.cv == pytest.approx(coefficient_of_variation([1.01, 0.99, 1.0, 1.02]))
    assert window.to_json() == {"window": 4, "cv": window.cv, "max_cv": 0.05, "first_step": 3, "last_step": 6}


def test_not_steady_when_the_times_still_vary() -> None:
    steps = numbered([1.0, 1.5, 0.7, 1.3, 0.9])
    assert steady_window(steps, RULE, warmup_steps=0) is None
    window = last_window(steps, RULE, warmup_steps=0)
    assert window is not None and not window.steady and window.cv > 0.05


def test_warm_up_steps_never_count() -> None:
    steps = numbered([1.0, 1.0, 1.0, 1.0, 1.0])
    assert steady_window(steps, RULE, warmup_steps=0) is not None
    assert steady_window(steps, RULE, warmup_steps=2) is None  # three measured steps < window 4
    window = steady_window(numbered([1.0] * 6), RULE, warmup_steps=2)
    assert window is not None and window.first_step == 3


def test_too_few_steps_is_not_steady() -> None:
    assert steady_window([], RULE, 0) is None
    assert steady_window(numbered([1.0, 1.0, 1.0]), RULE, 0) is None


def test_min_steps_holds_the_rule_back_until_that_step() -> None:
    rule = EarlyStop(window=4, max_cv=0.05, min_steps=8)
    assert steady_window(numbered([1.0] * 7), rule, 0) is None
    assert steady_window(numbered([1.0] * 8), rule, 0) is not None


def test_step_numbers_of_interval_logs_are_kept() -> None:
    """Frameworks that log every 10 steps: warm-up is by step number, the window by record."""
    steps = [(10, 5.0), (20, 1.0), (30, 1.0), (40, 1.0), (50, 1.0)]
    window = steady_window(steps, RULE, warmup_steps=15)
    assert window is not None and (window.first_step, window.last_step) == (20, 50)
    assert steady_window(steps, RULE, warmup_steps=25) is None


def test_undefined_cv_is_never_steady() -> None:
    assert coefficient_of_variation([1.0]) == math.inf
    assert coefficient_of_variation([0.0, 0.0]) == math.inf
    assert coefficient_of_variation([1.0, math.nan]) == math.inf
    assert steady_window(numbered([0.0] * 5), RULE, 0) is None


def test_settings_turn_it_on_and_bad_values_name_the_field() -> None:
    assert EarlyStop.from_settings({}) is None and EarlyStop.from_settings({"early_stop": None}) is None
    assert EarlyStop.from_settings({"early_stop": {"window": 3, "max_cv": 0.1}}) == EarlyStop(window=3, max_cv=0.1)
    with pytest.raises(ValueError, match=r"settings\.early_stop\.window: .*greater than or equal to 2"):
        EarlyStop.from_settings({"early_stop": {"window": 1, "max_cv": 0.1}})
    with pytest.raises(ValueError, match=r"settings\.early_stop: "):
        EarlyStop.from_settings({"early_stop": "yes"})
