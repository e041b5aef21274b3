"""Every effective policy of a schedule, its default spelled out (`duetime schedule show`,
its `--json`): nobody has to guess what a schedule does when an option was not given.

One entry per policy, in a fixed order: (key, value, is_default, text). Adding a policy is
adding one entry to `effective_policies`; the text and JSON renderers follow."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duetime.client.schedules import ScheduleInfo
from duetime.common.models import from_ms
from duetime.common.schedules import MISS_TOLERANCE_MS, ScheduleDef
from duetime.common.time.fmt import format_duration
from duetime.common.time.fmt import iso as _iso

_DEFAULTS = {f.name: f.default for f in ScheduleDef.__dataclass_fields__.values()}


@dataclass(frozen=True)
class Policy:
    key: str  # the name in --json
    label: str  # the name in the text
    value: Any  # as JSON shows it (None: none)
    default: bool  # the value is the default (not given, or given as the default)
    text: str  # the value as the text shows it


def _dur(seconds: float) -> str:
    return format_duration(timedelta(seconds=seconds))


def _p(key: str, label: str, value: Any, default: bool, text: str | None = None) -> Policy:
    return Policy(key, label, value, default, str(value) if text is None else text)


def effective_policies(info: ScheduleInfo, stagger_policy_ms: int = 0) -> list[Policy]:
    g = info.guardrails
    out = [
        _p("catchup", "catch-up", info.catchup, info.catchup == _DEFAULTS["catchup"]),
        _p("max_catchup", "max catch-up", info.max_catchup,
           info.max_catchup == _DEFAULTS["max_catchup"]),
        _p("miss_tolerance_s", "miss tolerance", info.miss_tolerance_s,
           info.miss_tolerance_s * 1000 == MISS_TOLERANCE_MS, _dur(info.miss_tolerance_s)),
        _p("lateness_s", "lateness", info.lateness_s or None, not info.lateness_s,
           _dur(info.lateness_s) if info.lateness_s else "none (no starting deadline)"),
        _p("overlap", "overlap", info.overlap or "allow", info.overlap in ("", "allow")),
        _p("jitter_s", "jitter", info.jitter_s or None, not info.jitter_s,
           _dur(info.jitter_s) if info.jitter_s else "none"),
    ]
    if info.stagger_s is None:
        ns = _dur(stagger_policy_ms / 1000) if stagger_policy_ms else "none"
        out.append(_p("stagger_s", "stagger", stagger_policy_ms / 1000, True,
                      f"namespace policy ({ns})"))
    else:
        out.append(_p("stagger_s", "stagger", info.stagger_s, False,
                      _dur(info.stagger_s) if info.stagger_s else "0 (exactly on time)"))
    # -- calendar: filled in by the calendars work (a calendar name and on_excluded) --------
    out.append(_p("calendar", "calendar", None, True, "none"))
    # -- guardrails ---------------------------------------------------------------------------
    paf = int(g.get("pause_after_failures", 0))
    out.append(_p("pause_after_failures", "pause after failures", paf or None, not paf,
                  f"{paf} consecutive dead runs (now {g.get('fail_streak', 0)})" if paf
                  else f"never (now {g.get('fail_streak', 0)} consecutive dead runs)"))
    for key in ("start", "end"):
        ms = int(g.get(f"{key}_ms", 0))
        out.append(_p(key, key, _iso(from_ms(ms)) if ms else None, not ms,
                      _iso(from_ms(ms), compact=True) or "" if ms else "none"))
    cap, made = int(g.get("max_runs", 0)), int(g.get("runs_made", 0))
    out.append(_p("max_runs", "max runs", cap or None, not cap,
                  f"{cap} ({max(0, cap - made)} remaining)" if cap else "none (unlimited)"))
    if cap:
        out.append(_p("max_runs_remaining", "runs remaining", max(0, cap - made), False))
    if g.get("ended"):
        out.append(_p("ended", "ended", g["ended"], False, f"by its {g['ended']} bound"))
    return out


def policy_lines(info: ScheduleInfo, stagger_policy_ms: int = 0) -> list[str]:
    """`  overlap: allow (default)`, one line per policy, under a `policies` header."""
    lines = ["  policies:"]
    for p in effective_policies(info, stagger_policy_ms):
        lines.append(f"    {p.label}: {p.text}{' (default)' if p.default else ''}")
    return lines


def policies_dict(info: ScheduleInfo, stagger_policy_ms: int = 0) -> dict[str, Any]:
    """{key: {"value": ..., "default": bool, "text": ...}} for --json."""
    return {p.key: {"value": p.value, "default": p.default, "text": p.text}
            for p in effective_policies(info, stagger_policy_ms)}
