"""The statistics of the quality loop (pure, numpy only).

- :func:`wilson_interval`: a confidence interval for a proportion (agreement, accuracy)
  that behaves at small counts and near 0 or 1, unlike the normal approximation
  ``p ± z·sqrt(p(1-p)/n)``, which gives intervals past [0, 1] and zero width at p = 1.
- :func:`psi` (population stability index) and :func:`js_distance` (Jensen-Shannon
  distance, base 2, in [0, 1]) compare two histograms over the same bins.
- :func:`proportion_drop`: whether a new proportion is significantly below an old one
  (a one-sided two-proportion z-test with a pooled variance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

PSI_EPSILON = 1e-4
"""Added to each bin's share before PSI's logarithm: an empty bin does not make it infinite."""


def z_for(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` (0.95 -> 1.96).

    Raises:
        ValueError: ``confidence`` not in (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} is not between 0 and 1")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval (lower, upper) of ``successes`` out of ``n``.

    ``n = 0`` gives (0.0, 1.0): nothing is known.

    Raises:
        ValueError: a negative count, or ``successes > n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"{successes} successes out of {n} is not a proportion")
    if n == 0:
        return 0.0, 1.0
    z = z_for(confidence)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _shares(counts: Sequence[float]) -> np.ndarray:
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or np.any(arr < 0) or not np.all(np.isfinite(arr)):
        raise ValueError("a histogram is a non-empty list of finite counts >= 0")
    total = float(arr.sum())
    if total <= 0:
        raise ValueError("a histogram with no counts has no shares")
    shares: np.ndarray = arr / total
    return shares


def _pair(reference: Sequence[float], current: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    if len(reference) != len(current):
        raise ValueError(f"histograms of {len(reference)} and {len(current)} bins")
    return _shares(reference), _shares(current)


def psi(reference: Sequence[float], current: Sequence[float]) -> float:
    """Population stability index of ``current`` against ``reference`` (same bins).

    ``sum((c - r) * ln(c / r))`` over bin shares (each plus :data:`PSI_EPSILON`). The
    usual reading: below 0.1 stable, 0.1-0.25 a moderate shift, above 0.25 a large one.

    Raises:
        ValueError: different bin counts, negative counts, or an empty histogram.
    """
    r, c = _pair(reference, current)
    r, c = r + PSI_EPSILON, c + PSI_EPSILON
    return float(np.sum((c - r) * np.log(c / r)))


def js_distance(reference: Sequence[float], current: Sequence[float]) -> float:
    """Jensen-Shannon distance (the square root of the divergence, base 2), in [0, 1].

    Raises:
        ValueError: different bin counts, negative counts, or an empty histogram.
    """
    p, q = _pair(reference, current)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / m[mask])))

    divergence = max(0.0, (kl(p) + kl(q)) / 2)
    return min(1.0, math.sqrt(divergence))


@dataclass(frozen=True)
class ProportionDrop:
    """A one-sided test that ``new`` is below ``old``: the observed ``drop`` (old - new),
    the z statistic and its p-value."""

    drop: float
    z: float
    p_value: float

    def significant(self, alpha: float) -> bool:
        """Whether the drop is significant at level ``alpha`` (p-value < alpha)."""
        return self.p_value < alpha


def proportion_drop(s_new: int, n_new: int, s_old: int, n_old: int) -> ProportionDrop:
    """Two-proportion z-test (pooled) of H1: new proportion < old proportion.

    Raises:
        ValueError: a count out of range or either side empty.
    """
    for s, n in ((s_new, n_new), (s_old, n_old)):
        if n <= 0 or s < 0 or s > n:
            raise ValueError(f"{s} successes out of {n} is not a proportion of a sample")
    p_new, p_old = s_new / n_new, s_old / n_old
    pooled = (s_new + s_old) / (n_new + n_old)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_new + 1 / n_old))
    drop = p_old - p_new
    if se == 0:
        return ProportionDrop(drop, 0.0, 1.0 if drop <= 0 else 0.0)
    z = drop / se
    return ProportionDrop(drop, z, 1 - NormalDist().cdf(z))
