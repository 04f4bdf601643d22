"""Early stop: once the last `window` step times vary little, more steps measure nothing new.

The rule: the coefficient of variation (sample std, ddof=1, over the mean) of the last `window`
step times after the warm-up is below `max_cv`, and the run has reached step `min_steps`.
One function decides it for both places that end runs: the built-in workload (after each of its
own steps) and the watchdog (on the step lines it parses from Megatron, nanotron or torchtitan
logs). The step budget (`settings.steps`) stays the cap.

Step times come as (step, seconds) pairs in step order, so that frameworks that log every N
steps (one record per interval) and warm-up by step number both work.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class EarlyStop(BaseModel):
    """`run.early_stop` in the spec, `settings.early_stop` in run.json; absent means off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(ge=2, description="how many post-warm-up step times the CV is taken over")
    max_cv: float = Field(gt=0, description="steady when the CV of the window is below this")
    min_steps: int = Field(default=0, ge=0, description="never end a run by this rule before this step")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> EarlyStop | None:
        """The rule of a run.json's settings, None when off; ValueError naming the bad field."""
        raw = settings.get("early_stop")
        if raw is None:
            return None
        try:
            return cls.model_validate(raw)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            field = "settings.early_stop" + (f".{where}" if where else "")
            raise ValueError(f"{field}: {first['msg']} (got {first.get('input')!r})") from None


@dataclass(frozen=True)
class Window:
    """The last `window` post-warm-up step times of a run and their CV."""

    first_step: int
    last_step: int
    window: int
    cv: float
    max_cv: float

    @property
    def steady(self) -> bool:
        return self.cv < self.max_cv

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "cv": self.cv if math.isfinite(self.cv) else None,
                "max_cv": self.max_cv, "first_step": self.first_step, "last_step": self.last_step}

    def describe(self) -> str:
        """One evidence line."""
        return (f"CV {self.cv:.4g} < {self.max_cv:g} over the last {self.window} step times "
                f"(steps {self.first_step}..{self.last_step})")


def coefficient_of_variation(times: Sequence[float]) -> float:
    """Sample std (ddof=1) over the mean; inf when it is undefined (n < 2, mean <= 0, NaN)."""
    if len(times) < 2 or not all(math.isfinite(t) for t in times):
        return math.inf
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else math.inf


def last_window(steps: Sequence[tuple[int, float]], rule: EarlyStop,
                warmup_steps: int) -> Window | None:
    """The CV of the last `rule.window` step times after step `warmup_steps`; None with fewer."""
    measured = [(step, seconds) for step, seconds in steps[-rule.window:] if step > warmup_steps]
    if len(measured) < rule.window:
        return None
    return Window(first_step=measured[0][0], last_step=measured[-1][0], window=rule.window,
                  cv=coefficient_of_variation([seconds for _, seconds in measured]), max_cv=rule.max_cv)


def steady_window(steps: Sequence[tuple[int, float]], rule: EarlyStop,
                  warmup_steps: int) -> Window | None:
    """The window that shows the run steady after its last step, or None: keep going.

    `steps`: (step number, step time in seconds) in step order; warm-up steps never count.
    """
    window = last_window(steps, rule, warmup_steps)
    if window is None or not window.steady or window.last_step < rule.min_steps:
        return None
    return window


__all__ = ["EarlyStop", "Window", "coefficient_of_variation", "last_window", "steady_window"]
