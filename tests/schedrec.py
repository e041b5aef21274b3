"""A schedule's stored record by field name, whichever layout holds it (docs/keys.md "The
schedule record"): what tests read and damage on purpose. A definition or cursor field is
edited inside the packed record (`T:scheds`), any other in the side hash `T:sched:<name>`."""

from __future__ import annotations

from typing import Any

import redis
from duetime.common.keys import Keyspace
from duetime.common.schedules import (
    RECORD_KEYS,
    STATE_KEYS,
    encode_record,
    merged_record,
    unpack_record,
)


def record(r: redis.Redis, k: Keyspace, name: str) -> dict[bytes, bytes]:
    """The schedule as named fields ({}: none)."""
    p = k.partition_of_schedule(name)
    side, packed = r.hgetall(k.sched(p, name)), r.hget(k.scheds(p), name)
    return merged_record(name, side, packed) if side or packed is not None else {}


def field(r: redis.Redis, k: Keyspace, name: str, f: str) -> bytes | None:
    return record(r, k, name).get(f.encode())


def edit(r: redis.Redis, k: Keyspace, name: str, **fields: Any) -> None:
    """Set named fields as a hand edit would (a value of None removes the field); keyword
    names spell `t.kind` as `t_kind`."""
    p = k.partition_of_schedule(name)
    packed = r.hget(k.scheds(p), name)
    short = {**RECORD_KEYS, **STATE_KEYS}
    rec = None if packed is None else unpack_record(packed)
    for f, v in fields.items():
        f = f.replace("t_", "t.", 1) if f.startswith("t_") else f
        if rec is not None and f in short:
            if v is None:
                rec.pop(short[f].encode(), None)
            else:
                rec[short[f].encode()] = v if isinstance(v, bytes) else str(v).encode()
        elif v is None:
            r.hdel(k.sched(p, name), f)
        else:
            r.hset(k.sched(p, name), f, v)
    if rec is not None:
        r.hset(k.scheds(p), name, encode_record({f.decode(): v for f, v in rec.items()}))
