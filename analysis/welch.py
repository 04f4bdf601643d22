"""Welch's t-test from summary statistics (mean, sample standard deviation, count), vectorised.

`sweep compare` asks whether a configuration's steady-state step time really moved between two
sweeps, or whether the difference is what its steps' own scatter allows. runs.parquet keeps each
run's step-time mean, standard deviation (ddof=1) and count, not the steps, so the test works
from those: Welch's unequal-variance t statistic with the Welch–Satterthwaite degrees of freedom,
and a one-sided p-value from Student's t distribution. scipy is not a dependency, so the
distribution's tail is computed here: the regularised incomplete beta function by its continued
fraction (Lentz's method), in numpy over whole columns, so 4,000 tests take milliseconds.

Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

TEST_NAME: Final = "Welch's t-test (one-sided, unequal variances) on the steady-state step times"
_ITERATIONS: Final = 300
_TINY: Final = 1e-300

Floats = npt.NDArray[np.float64]


def welch_t(mean_a: Floats, std_a: Floats, n_a: Floats,
            mean_b: Floats, std_b: Floats, n_b: Floats) -> tuple[Floats, Floats]:
    """Welch's t of b − a and its Welch–Satterthwaite degrees of freedom, element-wise. NaN where
    a side has fewer than 2 samples or no standard deviation (the test cannot be made); where both
    spreads are zero, t is ±inf for a difference (0 for none) and the degrees of freedom are
    n_a + n_b − 2."""
    var_a = np.asarray(std_a, dtype=float) ** 2 / n_a
    var_b = np.asarray(std_b, dtype=float) ** 2 / n_b
    se2 = var_a + var_b
    diff = np.asarray(mean_b, dtype=float) - np.asarray(mean_a, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se2 > 0, diff / np.sqrt(se2), np.sign(diff) * np.inf)
        t = np.where((se2 == 0) & (diff == 0), 0.0, t)
        df = np.where(se2 > 0, se2 ** 2 / (var_a ** 2 / (n_a - 1) + var_b ** 2 / (n_b - 1)),
                      np.asarray(n_a, dtype=float) + n_b - 2)
    testable = (np.asarray(n_a) >= 2) & (np.asarray(n_b) >= 2) & np.isfinite(var_a) & np.isfinite(var_b)
    return np.where(testable, t, np.nan), np.where(testable, df, np.nan)


def t_sf(t: Floats, df: Floats) -> Floats:
    """P(T > t) for Student's t with `df` degrees of freedom (any positive real), element-wise:
    ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0, its complement below. NaN in, NaN out."""
    t = np.asarray(t, dtype=float)
    df = np.asarray(df, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(np.isinf(t), 0.0, df / (df + t * t))
    half_tail = 0.5 * betainc(df / 2.0, np.full_like(df, 0.5), x)
    return np.where(t >= 0, half_tail, 1.0 - half_tail)


def one_sided_p(t: Floats, df: Floats, greater: bool) -> Floats:
    """p-value of the one-sided test: H1 "b's mean is greater than a's" (`greater`), or less."""
    return t_sf(t, df) if greater else t_sf(-np.asarray(t, dtype=float), df)


def betainc(a: Floats, b: Floats, x: Floats) -> Floats:
    """The regularised incomplete beta function I_x(a, b), element-wise (a, b > 0, 0 ≤ x ≤ 1),
    by its continued fraction, evaluated where it converges fast (x < (a+1)/(a+b+2)) and through
    the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) elsewhere."""
    a, b, x = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(a, b, x))
    swap = x > (a + 1.0) / (a + b + 2.0)
    aa, bb, xx = np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1.0 - x, x)
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    ok = np.isfinite(aa) & np.isfinite(bb) & np.isfinite(xx) & (xx > 0) & (xx < 1)
    safe_a, safe_b, safe_x = np.where(ok, aa, 1.0), np.where(ok, bb, 1.0), np.where(ok, xx, 0.5)
    log_front = (lgamma(safe_a + safe_b) - lgamma(safe_a) - lgamma(safe_b)
                 + safe_a * np.log(safe_x) + safe_b * np.log1p(-safe_x))
    value = np.exp(log_front) * _continued_fraction(safe_a, safe_b, safe_x) / safe_a
    value = np.where(ok, value, np.where(xx >= 1, 1.0, 0.0))
    value = np.where(swap, 1.0 - value, value)
    return np.where(np.isnan(x) | np.isnan(a) | np.isnan(b), np.nan, value)


def _continued_fraction(a: Floats, b: Floats, x: Floats) -> Floats:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf), modified Lentz's method,
    a fixed number of terms for every element (ample for the degrees of freedom of step counts)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = _nonzero(1.0 - qab * x / qap)
    d = 1.0 / d
    h = d.copy()
    for m in range(1, _ITERATIONS + 1):
        m2 = 2.0 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 / _nonzero(1.0 + aa * d)
        c = _nonzero(1.0 + aa / c)
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 / _nonzero(1.0 + aa * d)
        c = _nonzero(1.0 + aa / c)
        delta = d * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-14):
            break
    return h


def _nonzero(values: Floats) -> Floats:
    return np.where(np.abs(values) < _TINY, _TINY, values)
