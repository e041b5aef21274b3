"""Counts and flags as a user writes them (task options, enqueue arguments) or as they are read
back from Redis (a worker's published task options): one parser per kind of value, so the same
bad value is refused with the same message wherever it is written or read.

Durations and instants have theirs in `common.time.parse`. A count is an `int` (never a
`bool`, a float or a numeric string: `1.5` retries or `float("inf")` have no meaning, and
`True` would silently be 1) within stated bounds; a flag is a `bool` (never `"no"`, which is
truthy, or `0`).
"""

from __future__ import annotations

from typing import Any

from duetime.common.errors import InvalidInput

__all__ = ["count", "flag"]


def count(value: Any, what: str, lo: int = 0, hi: int | None = None) -> int:
    """`value` if it is an int in [lo, hi]; else InvalidInput naming `what` and the range."""
    shown = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer in {shown}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise InvalidInput(f"{what} must be an integer in {shown}, got {value!r}")
    return value


def flag(value: Any, what: str) -> bool:
    """`value` if it is a bool; else InvalidInput naming `what`."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, got {value!r}")
    return value
