"""The one percentile duetime reports (`top`, the gauges, the benchmarks)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile, p in 0..100: the smallest value with at least p % of the values
    at or below it (p=0 is the minimum, p=100 the maximum); None for no values. Always one of
    the values, never an interpolation, so a p99 lateness is a lateness some run really had."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be within 0..100, got {p}")
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]
