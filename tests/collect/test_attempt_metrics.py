"""An attempt's measured columns (sweep.collect.attempt_metrics); the folders end to end are in
tests/collect/test_attempts.py."""

from __future__ import annotations

from sweep.collect.attempt_metrics import check_logged_rate


def test_the_logged_rate_check_tests_the_batch_not_the_spread_of_step_times() -> None:
    """Rates of 1,000 and 3,000 tokens/s over steps of 1 s and 1/3 s are one batch of 1,000
    tokens: tokens / mean step time is 1,500, and so is their harmonic mean (the arithmetic
    mean, 2,000, would call a busy machine a wrong batch)."""
    steps = [{"step": 2, "tokens_per_sec": 1000.0}, {"step": 3, "tokens_per_sec": 3000.0}]
    issues: list[str] = []
    check_logged_rate(steps, 1, {"tokens_per_sec": 1500.0}, issues)
    assert issues == []
    check_logged_rate(steps, 1, {"tokens_per_sec": 750.0}, issues)  # half the logged batch
    assert len(issues) == 1 and "does the run's batch match run.json" in issues[0]
