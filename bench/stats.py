"""Pure helpers for the peer benchmark: percentiles and median/min/max summaries."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from duetime.common.stats import percentile as common_percentile


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence: the smallest value with at
    least p % of the values at or below it; p=0 gives the minimum, p=100 the maximum."""
    value = common_percentile(values, p)
    if value is None:
        raise ValueError("percentile of no values")
    return value


def summary(values: Sequence[float | None]) -> dict[str, float] | None:
    """median, min, max and count of the values that are not None; None when there are none."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return {"median": statistics.median(vs), "min": min(vs), "max": max(vs), "n": len(vs)}


def ratios(ours: Sequence[float | None], theirs: Sequence[float | None]) -> list[float]:
    """Per-round ratios ours[r] / theirs[r], only for rounds where both were measured and the
    divisor is not zero (a ratio is only taken between numbers measured in the same round)."""
    return [a / b for a, b in zip(ours, theirs, strict=False) if a is not None and b not in (None, 0)]


def print_rounds(rounds: list[dict[str, float]], width: int = 24) -> None:
    """One line per measure: median and min-max over the rounds (the duetime-only benches)."""
    for key in rounds[0]:
        vals = [r[key] for r in rounds]
        print(f"  {key:<{width}} median {statistics.median(vals):10.2f}   min {min(vals):10.2f}"
              f"   max {max(vals):10.2f}")
