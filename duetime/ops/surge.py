"""Surges at common boundaries: how many runs the schedules of a namespace start in each second
of a horizon, where they pile up, and which stagger would spread them.

Pure functions (no Redis, no clock): the caller passes the schedules and the start instant.
Occurrences come from each schedule's own `next_after`, but schedules whose triggers fire at
the same instants (a cron's parsed values, zone and DST policies: `H` with seeds that hash
alike counts once) are evaluated once: 10,000 schedules at `0 * * * *` cost one walk of 24
occurrences plus one addition per run. A run's second is its due time: occurrence + the
schedule's stagger offset + its jitter, exactly what the evaluator computes
(common/schedules.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from duetime.common.schedules import effective_stagger_ms, jitter_for, stagger_for
from duetime.common.time.fmt import format_duration
from duetime.common.time.parse import from_ms, to_ms
from duetime.common.time.spec import Cron, Trigger

# An expression that fires more often than this in the horizon is walked this far only (an
# `Every(1ms)` would otherwise take minutes); the profile says it was cut.
MAX_OCCURRENCES = 200_000
# `schedule lint`'s target when neither a flag nor a live worker gives one
DEFAULT_MAX_PER_SECOND = 100
# The staggers `suggest_stagger` proposes: round values an operator would write
LADDER_S = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1200, 1800, 3600,
            7200, 14400, 21600, 43200, 86400)
# `H` as a cron item (not the H of THU): the trigger's seed then matters
H_ITEM = re.compile(r"(?<![A-Za-z@])H")


@dataclass(frozen=True)
class LintSchedule:
    """What the profile needs of one schedule."""

    name: str
    trigger: Trigger
    jitter_ms: int = 0
    stagger_ms: int | None = None  # its own; None: the namespace policy


@dataclass(frozen=True)
class HotSpot:
    second_ms: int  # the second's start (epoch ms, UTC)
    count: int  # runs due within it
    schedules: tuple[str, ...]  # some of them (at most `examples`), by name
    more: int  # how many others


@dataclass
class Profile:
    """Runs per second over (start, start + horizon]."""

    start_ms: int
    horizon_ms: int
    schedules: int
    runs: int
    evaluations: int  # distinct trigger walks (schedules firing alike share one)
    peak: int
    busy_seconds: int  # seconds with at least one run
    over: int  # seconds holding more than `max_per_second`
    max_per_second: int
    hot: list[HotSpot] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # schedules walked up to MAX_OCCURRENCES

    @property
    def flat(self) -> bool:
        return self.peak <= self.max_per_second


def collapse_key(trigger: Trigger) -> tuple[Any, ...]:
    """Triggers with equal keys fire at the same instants: a cron by what its expression
    matches once parsed (its seed only matters through `H`'s values), the others by their
    definition."""
    if isinstance(trigger, Cron):
        return ("cron", *trigger.instants_key())
    return tuple(sorted((k, str(v)) for k, v in trigger.to_dict().items()))


def occurrences_ms(trigger: Trigger, start_ms: int, end_ms: int,
                   limit: int = MAX_OCCURRENCES) -> tuple[list[int], bool]:
    """The trigger's occurrences in (start, end] as ms (rounded up, as the evaluator does),
    by chaining its own `next_after`; → (occurrences, cut at `limit`)."""
    out: list[int] = []
    t = trigger.next_after(from_ms(start_ms))
    while t is not None:
        ms = to_ms(t, ceil=True)
        if ms > end_ms:
            return out, False
        if len(out) >= limit:
            return out, True
        out.append(ms)
        t = trigger.next_after(t)
    return out, False


def _groups(schedules: Iterable[LintSchedule]) -> dict[tuple[Any, ...], list[LintSchedule]]:
    groups: dict[tuple[Any, ...], list[LintSchedule]] = {}
    for s in schedules:
        groups.setdefault(collapse_key(s.trigger), []).append(s)
    return groups


Walks = dict[tuple[Any, ...], tuple[list[int], bool]]


def walk(schedules: list[LintSchedule], start_ms: int, horizon_ms: int,
         progress: Callable[[int], None] | None = None) -> Walks:
    """Each distinct trigger's occurrences once (the slow part: `progress(n)` after each group
    of n schedules); reused by every profile of the same schedules."""
    out: Walks = {}
    for key, members in _groups(schedules).items():
        out[key] = occurrences_ms(members[0].trigger, start_ms, start_ms + horizon_ms)
        if progress:
            progress(len(members))
    return out


def _jittered(members: list[_Member], occs: list[int]) -> Iterable[tuple[str, int]]:
    """(name, second) of every run of schedules with a jitter: one hash per run."""
    for s in members:
        for o in occs:
            yield s.name, (o + s.offset_ms + jitter_for(s.name, o, s.jitter_ms)) // 1000


@dataclass(frozen=True)
class _Member:
    name: str
    jitter_ms: int
    offset_ms: int  # its stagger offset under the policy profiled


def _split(members: list[LintSchedule], policy_ms: int) -> tuple[list[_Member], list[_Member]]:
    """(fixed-offset members, jittered members) with their stagger offsets."""
    fixed: list[_Member] = []
    jittered: list[_Member] = []
    for s in members:
        m = _Member(s.name, s.jitter_ms,
                    stagger_for(s.name, effective_stagger_ms(s.stagger_ms, policy_ms)))
        (jittered if s.jitter_ms else fixed).append(m)
    return fixed, jittered


def _shifts(fixed: list[_Member], occs: list[int]) -> dict[int, dict[int, list[str]]]:
    """Per ms residue of the occurrences: seconds after the occurrence's second -> the names
    of the fixed-offset members whose run lands there. A run is due at o + offset, in second
    o // 1000 + (o % 1000 + offset) // 1000: the members are grouped once per residue, not
    once per occurrence."""
    out: dict[int, dict[int, list[str]]] = {}
    for r in {o % 1000 for o in occs}:
        by: dict[int, list[str]] = {}
        for m in fixed:
            by.setdefault((r + m.offset_ms) // 1000, []).append(m.name)
        out[r] = by
    return out


def profile(schedules: list[LintSchedule], start_ms: int, horizon_ms: int, *,
            max_per_second: int, policy_ms: int = 0, top: int = 10, examples: int = 5,
            walks: Walks | None = None, progress: Callable[[int], None] | None = None) -> Profile:
    """Runs per second of `schedules` over (start, start + horizon], with the namespace's
    default stagger `policy_ms`; the `top` busiest seconds (earliest first among equals), each
    with up to `examples` schedule names."""
    walks = walks if walks is not None else walk(schedules, start_ms, horizon_ms, progress)
    parts = []
    counts: Counter[int] = Counter()
    runs = 0
    truncated: list[str] = []
    for key, members in _groups(schedules).items():
        occs, cut = walks[key]
        if cut:
            truncated += [s.name for s in members]
        fixed, jittered = _split(members, policy_ms)
        shifts = _shifts(fixed, occs)
        sizes = {r: [(k, len(v)) for k, v in by.items()] for r, by in shifts.items()}
        for o in occs:
            base = o // 1000
            for k, n in sizes[o % 1000]:
                counts[base + k] += n
        for _, sec in _jittered(jittered, occs):
            counts[sec] += 1
        runs += len(occs) * len(members)
        parts.append((occs, shifts, jittered))
    hot_seconds = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    names: dict[int, list[str]] = {sec: [] for sec, _ in hot_seconds}
    if names:  # a second pass names the schedules of the hot seconds only
        for occs, shifts, jittered in parts:
            for o in occs:
                base = o // 1000
                for k, who in shifts[o % 1000].items():
                    bucket = names.get(base + k)
                    if bucket is not None:
                        bucket += who
            for name, sec in _jittered(jittered, occs):
                bucket = names.get(sec)
                if bucket is not None:
                    bucket.append(name)
    hot = [HotSpot(sec * 1000, n, tuple(sorted(names[sec])[:examples]),
                   max(0, n - examples)) for sec, n in hot_seconds]
    peak = hot_seconds[0][1] if hot_seconds else 0
    return Profile(start_ms, horizon_ms, len(schedules), runs, len(walks), peak, len(counts),
                   sum(1 for n in counts.values() if n > max_per_second), max_per_second, hot,
                   truncated)


@dataclass(frozen=True)
class Suggestion:
    stagger_ms: int | None  # the smallest ladder value that flattens; None: none needed or none does
    peak_after: int  # the busiest second with it (or with the widest tried)
    needed: bool  # some second is above the target now
    reason: str  # one line for the operator


def suggest_stagger(schedules: list[LintSchedule], start_ms: int, horizon_ms: int, *,
                    max_per_second: int, policy_ms: int = 0, peak: int | None = None,
                    walks: Walks | None = None) -> Suggestion:
    """The narrowest default stagger (from LADDER_S, no narrower than the busiest second
    needs) under which no second holds more than
    `max_per_second` runs, found by profiling each candidate: the offsets are hashes, so the
    busiest second of a spread is a little above its average. It applies to the schedules
    that follow the namespace policy; the others keep their own stagger."""
    walks = walks if walks is not None else walk(schedules, start_ms, horizon_ms)
    if peak is None:
        peak = profile(schedules, start_ms, horizon_ms, max_per_second=max_per_second,
                       policy_ms=policy_ms, top=1, walks=walks).peak
    if peak <= max_per_second:
        return Suggestion(None, peak, False, f"no second holds more than {max_per_second} runs")
    following = [s for s in schedules if s.stagger_ms is None]
    if not following:
        return Suggestion(None, peak, True, "every schedule has its own stagger: the policy "
                          "changes none; give the busiest ones a wider --stagger")
    runs = sum(len(walks[collapse_key(s.trigger)][0]) for s in schedules)
    if runs > max_per_second * horizon_ms / 1000:  # more than the target on average: no spread helps
        return Suggestion(None, peak, True, f"{runs} runs in {horizon_ms // 1000}s average more "
                          f"than {max_per_second} a second: the load itself is above the target, "
                          "not only its alignment")
    # Under a policy of w seconds, the runs of the busiest second without any policy spread
    # over at most w + 1 seconds: w must be at least that peak / target - 1. (Starting from
    # the peak under the current policy instead would walk up the whole ladder.)
    bare = peak if not policy_ms else profile(schedules, start_ms, horizon_ms,
                                              max_per_second=max_per_second, top=1,
                                              walks=walks).peak
    need_s = max(1, math.ceil(bare / max_per_second) - 1)
    last = peak
    for width_s in (w for w in LADDER_S if w >= need_s):
        p = profile(schedules, start_ms, horizon_ms, max_per_second=max_per_second,
                    policy_ms=width_s * 1000, top=1, walks=walks)
        last = p.peak
        if p.peak <= max_per_second:
            width = format_duration(timedelta(seconds=width_s))
            return Suggestion(width_s * 1000, p.peak, True,
                              f"a default stagger of {width} leaves at most {p.peak} runs "
                              f"in a second")
    return Suggestion(None, last, True, f"no default stagger up to 1 day brings every second to "
                      f"{max_per_second} runs or fewer (busiest then: {last}); the load itself "
                      "is above the target, not only its alignment")
