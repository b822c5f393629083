"""Paired on/off statistics for ``mqbench``'s same-run comparisons: the ratio of each pair of
rounds, their median and a distribution-free confidence interval for that median.

The interval is the sign-test (order-statistic) interval: with ``n`` ratios sorted, the true
median lies between the ``k``-th smallest and the ``k``-th largest with probability at least
``1 - 2 P(B <= k - 1)``, ``B ~ Binomial(n, 1/2)``; ``k`` is the largest rank keeping that at or
above the confidence asked. It assumes only that the pairs are independent, not that the
ratios are normal (a loaded machine's are not: a pair hit by another job's burst is an outlier,
and the interval does not stretch for it as a mean's would). Standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95


def pair_ratios(on: Sequence[float], off: Sequence[float]) -> list[float]:
    """``on[i] / off[i]`` for every pair ``i`` (the two sides measured back to back); a pair
    with a side of 0 (nothing measured) is left out."""
    if len(on) != len(off):
        raise ValueError(f"{len(on)} on rounds but {len(off)} off rounds: not pairs")
    return [a / b for a, b in zip(on, off, strict=True) if a > 0 and b > 0]


def sign_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float] | None:
    """``(k, coverage)``: the interval from the ``k``-th smallest to the ``k``-th largest of
    ``n`` values covers their median with probability ``coverage >= confidence``; None when
    ``n`` is too small for any such interval (under 6 pairs at 95 %)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} not in (0, 1)")
    tail = (1 - confidence) / 2
    k, below, cdf = 0, 0.0, 0.0
    for j in range(n + 1):
        cdf += math.comb(n, j) / 2**n
        if cdf > tail:
            break
        k, below = j + 1, cdf
    if k == 0 or 2 * k > n:
        return None
    return k, 1 - 2 * below


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The median of ``values``, the sign-test interval around it and that interval's actual
    coverage (``low``/``high``/``coverage`` None when there are too few values)."""
    ordered = sorted(values)
    n = len(ordered)
    out: dict[str, Any] = {"n": n, "median": statistics.median(ordered) if n else None}
    rank = sign_rank(n, confidence)
    if rank is None:
        return {**out, "low": None, "high": None, "coverage": None}
    k, coverage = rank
    return {**out, "low": ordered[k - 1], "high": ordered[n - k], "coverage": coverage}


def paired(on: Sequence[float], off: Sequence[float]) -> dict[str, Any]:
    """The pair ratios on/off, their median with its interval, and each side's median."""
    ratios = pair_ratios(on, off)
    return {
        **median_ci(ratios),
        "on_median": statistics.median(on) if on else None,
        "off_median": statistics.median(off) if off else None,
        "ratios": ratios,
    }


def verdict(ci: dict[str, Any], bound: float, higher_is_cost: bool) -> str:
    """Whether the interval puts the cost within ``bound`` (a ratio: 0.98 for a rate that may
    drop 2 %, 1.02 for a CPU per message that may rise 2 %): "within", "beyond", or
    "undecided" when the interval straddles the bound or there is none."""
    low, high = ci.get("low"), ci.get("high")
    if low is None or high is None:
        return "undecided"
    if higher_is_cost:
        return "within" if high <= bound else "beyond" if low > bound else "undecided"
    return "within" if low >= bound else "beyond" if high < bound else "undecided"
