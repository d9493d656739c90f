"""Small statistics for one-sided A/A tests.

A run of a mask diverges with some per-run chance q. A divergence is conclusive;
only a clean verdict can be wrong: after n clean runs it misses a real chance q
with probability (1-q)^n. Everything here is pure math, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError


def _check_probability(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise BisectPrefetchError(f"{name} must be strictly between 0 and 1, got {value}")


# -- binomial tails and Clopper-Pearson bounds --------------------------------
def _log_binomial_pmf(k: int, n: int, p: float) -> float:
    log_choose = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return log_choose + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_at_least(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return min(1.0, sum(math.exp(_log_binomial_pmf(i, n, p)) for i in range(k, n + 1)))


def _solve_increasing(f: Callable[[float], float], target: float) -> float:
    """The p in [0, 1] where an increasing f(p) crosses target (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if f(mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval for a per-run chance after k divergences in n runs.

    Each end is where the binomial tail on its side equals (1 - confidence) / 2
    (equivalent to the beta quantiles of the usual statement).
    """
    _check_probability("confidence", confidence)
    if not 0 <= k <= n:
        raise BisectPrefetchError(f"need 0 <= divergences <= runs, got {k} of {n}")
    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2
    low = 0.0 if k == 0 else _solve_increasing(lambda p: binomial_at_least(k, n, p), tail)
    # P(X <= k) falls as p grows, so P(X >= k+1) = 1 - P(X <= k) rises.
    high = 1.0 if k == n else _solve_increasing(
        lambda p: binomial_at_least(k + 1, n, p), 1.0 - tail
    )
    return low, high


def upper_bound_none_seen(n: int, confidence: float = 0.95) -> float:
    """One-sided upper bound on the per-run chance after n clean runs (about 3/n at 95%)."""
    _check_probability("confidence", confidence)
    if n <= 0:
        return 1.0
    return 1.0 - (1.0 - confidence) ** (1.0 / n)


# -- comparing two per-run chances ----------------------------------------------
_RATE_GRID = (np.arange(2000) + 0.5) / 2000


def _beta_weights(divergences: float, clean: float) -> np.ndarray:
    """The posterior of a per-run chance on _RATE_GRID, from a uniform prior."""
    log = divergences * np.log(_RATE_GRID) + clean * np.log1p(-_RATE_GRID)
    weight = np.exp(log - log.max())
    return weight / weight.sum()


def chance_below(low: tuple[float, float], high: tuple[float, float], factor: float = 1.0) -> float:
    """P(a < b / factor) for per-run chances a and b, each from its (divergences, clean runs)
    under a uniform prior: e.g. that all-off diverges less than half as often as all-on."""
    a, b = _beta_weights(*low), _beta_weights(*high)
    below = np.concatenate([[0.0], np.cumsum(a)])  # below[i]: P(a < _RATE_GRID[i] - half a cell)
    cut = np.searchsorted(_RATE_GRID, _RATE_GRID / factor)
    return float((b * below[cut]).sum())


# -- sizing clean verdicts -----------------------------------------------------
def runs_for_clean_verdict(q: float, alpha: float) -> int:
    """Smallest n with (1-q)^n <= alpha: n >= ln(alpha) / ln(1-q)."""
    _check_probability("per-run chance", q)
    _check_probability("error", alpha)
    # The small slack keeps an exact integer ratio from rounding up by float noise.
    return max(1, math.ceil(math.log(alpha) / math.log1p(-q) - 1e-9))


def error_share(alpha: float, index: int) -> float:
    """The index-th (1-based) clean verdict's share of an error budget alpha.

    Shares alpha / (i (i+1)) sum to alpha over any number of verdicts, so the
    budget holds without knowing in advance how many clean verdicts are needed.
    """
    if index < 1:
        raise BisectPrefetchError(f"verdict index starts at 1, got {index}")
    return alpha / (index * (index + 1))


# -- hazards ---------------------------------------------------------------------
def per_run_chance(hazard: float, steps: int) -> float:
    """q = 1 - (1-h)^T: the chance a run of T steps diverges at per-step hazard h."""
    return 1.0 - (1.0 - hazard) ** steps


def hazard_for_chance(q: float, steps: int) -> float:
    """The per-step hazard h that gives per-run chance q over T steps."""
    _check_probability("per-run chance", q)
    if steps < 1:
        raise BisectPrefetchError(f"steps must be at least 1, got {steps}")
    return 1.0 - (1.0 - q) ** (1.0 / steps)


def hazard_estimate(first_diff_steps: Sequence[int], clean_steps: Sequence[int]) -> float | None:
    """Per-step hazard from first differing steps (1-based) and the lengths of clean runs.

    Maximum likelihood under a constant hazard: divergences over steps at risk,
    where a run that first differs at step k was at risk for k steps.
    None when no run diverged.
    """
    if not first_diff_steps:
        return None
    at_risk = sum(first_diff_steps) + sum(clean_steps)
    return len(first_diff_steps) / at_risk


# -- vectorised special functions for the posterior ----------------------------
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_SHIFT = 8


def log_gamma(x: np.ndarray | float) -> np.ndarray:
    """ln Gamma(x) for x > 0, elementwise (math.lgamma is scalar only).

    Stirling's series at x + 8, where its error is below 1e-11, shifted back
    with Gamma(x) = Gamma(x + 8) / (x (x+1) ... (x+7)).
    """
    if np.ndim(x) == 0:
        return np.asarray(math.lgamma(float(x)))
    x = np.asarray(x, dtype=float)
    y = x + _SHIFT
    inv, inv2 = 1.0 / y, 1.0 / (y * y)
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    stirling = (y - 0.5) * np.log(y) - y + _HALF_LOG_2PI + series
    product = np.ones_like(x)
    for k in range(_SHIFT):
        product = product * (x + k)
    return stirling - np.log(product)


def log_beta(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    return log_gamma(a) + log_gamma(b) - log_gamma(np.asarray(a) + np.asarray(b))


def binary_entropy(p: np.ndarray | float) -> np.ndarray:
    """Entropy in bits of a coin with chance p (0 at p = 0 or 1)."""
    p = np.clip(np.asarray(p, dtype=float), 1e-300, 1.0)
    q = np.clip(1.0 - p, 1e-300, 1.0)
    return -(p * np.log2(p) + q * np.log2(q))


def z_channel_capacity(q: float) -> float:
    """Bits one run can tell at most when a run enabling the culprit diverges with chance q
    and any other run never does (a Z-channel)."""
    return math.log2(1 + q * (1 - q) ** ((1 - q) / q))
