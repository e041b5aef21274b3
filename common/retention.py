"""Retention by state: how long finished runs are kept, per state, with per-queue and per-task
overrides (docs/operations.md "Retention", docs/states.md).

Where it is set, most specific first: `duetime retention set --task T` (namespace), then
`@app.task(retention=...)` (published by workers with the task's options), then
`duetime retention set --queue Q`, then `duetime retention set` (the namespace's default),
then the built-in defaults below (the reaper's `--retention` for succeeded runs and the other
short-lived states).

The reaper copies the merged table into every partition's `T:retention` hash (fields
`<scope>|<state>` -> ms, scope `*`, `q:<queue>` or `t:<task>`; 0 = never delete) in one
transaction when it changed, so reap.lua reads it in its own slot. The sweep examines each
finished run once when it comes within the shortest retention (a watermark per index,
`T:swept`) and files a run kept longer in `T:kept` (run id -> delete-at ms): its cost per
call is bounded by the batch, whatever the number of finished runs kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from duetime.common.errors import InvalidInput
from duetime.common.time.parse import Span, duration_ms

# the states a finished run is kept in, each in an index the sweep reads
STATES = ("succeeded", "cancelled", "skipped", "missed", "dead", "uncertain")
DAY_MS = 24 * 3600 * 1000
# the built-in defaults (ms; 0 = never deleted). succeeded, cancelled, skipped and missed take
# the reaper's --retention (24 h unless given); a dead letter is kept 30 days (it was kept
# until an operator acted: an unwatched dead-letter set then grew without bound); an uncertain
# run is never deleted by the sweep: its outcome is unknown until an operator resolves it.
DEAD_MS = 30 * DAY_MS
UNCERTAIN_MS = 0
SHORT_STATES = ("succeeded", "cancelled", "skipped", "missed")
RETENTION = Span(timedelta(seconds=1), timedelta(days=36500))
NEVER = ("never", "forever", "keep")
DIGEST = "_digest"  # the field of T:retention naming the table it holds


def defaults(short_ms: int) -> dict[str, int]:
    """Built-in retention per state, `short_ms` being the reaper's --retention."""
    out = {s: short_ms for s in SHORT_STATES}
    out.update(dead=DEAD_MS, uncertain=UNCERTAIN_MS)
    return out


def parse_one(value: Any, what: str) -> int:
    """A duration (timedelta, seconds, "30d") → ms, or "never"/None... → 0 (never deleted)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in NEVER):
        return 0
    return duration_ms(RETENTION.parse(value, what))


def parse_retention(value: Any, what: str = "retention") -> dict[str, int]:
    """`retention=` as given: one duration (every state) or {state: duration | "never"}."""
    if isinstance(value, Mapping):
        out: dict[str, int] = {}
        for state, v in value.items():
            if state not in STATES:
                raise InvalidInput(f"{what}: unknown state {state!r}; the states: {', '.join(STATES)}")
            out[state] = parse_one(v, f"{what} of {state}")
        return out
    ms = parse_one(value, what)
    return dict.fromkeys(STATES, ms)


def scope_field(kind: str, name: str) -> str:
    """The config field of a scope: `*` (namespace), `queue:<q>`, `task:<t>`."""
    return "*" if kind == "namespace" else f"{kind}:{name}"


def table(config: Mapping[bytes | str, bytes | str], tasks: Mapping[bytes | str, bytes | str]
          ) -> dict[str, int]:
    """The partition table (`<scope>|<state>` -> ms) from the namespace's config hash
    (`<ns>:retention`: `*`, `queue:<q>`, `task:<t>` -> JSON {state: ms}) and the task catalogue
    (`<ns>:tasks`: a task's options JSON may carry `retention`). A damaged entry is skipped."""
    def text(x: bytes | str) -> str:
        return x.decode(errors="replace") if isinstance(x, bytes) else x

    def states(raw: bytes | str) -> dict[str, int]:
        try:
            d = json.loads(text(raw))
        except ValueError:
            return {}
        if not isinstance(d, dict):
            return {}
        return {s: int(v) for s, v in d.items()
                if s in STATES and isinstance(v, int) and not isinstance(v, bool) and v >= 0}

    out: dict[str, int] = {}
    for name, raw in tasks.items():  # the decorator's, under the operator's task override
        try:
            opts = json.loads(text(raw))
        except ValueError:
            continue
        if isinstance(opts, dict) and isinstance(opts.get("retention"), dict):
            for s, v in states(json.dumps(opts["retention"])).items():
                out[f"t:{text(name)}|{s}"] = v
    for field, raw in config.items():
        f = text(field)
        scope = "*" if f == "*" else ("q:" + f[6:] if f.startswith("queue:")
                                      else "t:" + f[5:] if f.startswith("task:") else "")
        if not scope:
            continue
        for s, v in states(raw).items():
            out[f"{scope}|{s}"] = v
    return out


def digest(t: Mapping[str, int], short_ms: int) -> str:
    h = hashlib.sha256(json.dumps([sorted(t.items()), short_ms]).encode())
    return h.hexdigest()[:16]


def effective(t: Mapping[str, int], short_ms: int, state: str, queue: str = "",
              task: str = "") -> int:
    """What reap.lua applies to one run (ms, 0 = never): the Python twin of its lookup."""
    for scope in (f"t:{task}", f"q:{queue}", "*"):
        v = t.get(f"{scope}|{state}")
        if v is not None:
            return v
    return defaults(short_ms)[state]
