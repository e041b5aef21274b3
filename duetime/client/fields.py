"""Reading records without their large fields: a listing or a page that does not show a
run's or schedule's payload (up to the payload cap each, 512 KiB by default) must not make
Redis send it. HGETALL cannot leave a field out, so the field names are read first (HKEYS,
a few bytes each) and then the values of all but the skipped ones (HMGET): two pipelined
round trips for any number of records, and a field added to a record later is still read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

# run records (a checkpoint's size is its own field, `checkpoint_size`); schedules have a
# payload only
LARGE = frozenset({b"payload", b"result", b"checkpoint"})


def hashes_without(client: redis.Redis, keys: Sequence[str], skip: frozenset[bytes],
                   execute: Callable[[Any], list[Any]] | None = None) -> list[dict[bytes, bytes]]:
    """The hashes at `keys`, each without the fields in `skip` ({} for a missing key).
    `execute(pipe)` runs a pipeline (a caller's error translation); default: `pipe.execute()`."""
    run = execute or (lambda pipe: pipe.execute())
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hkeys(key)
    names = [[f for f in fs if f not in skip] for fs in run(pipe)]
    pipe = client.pipeline(transaction=False)
    asked = [i for i, fs in enumerate(names) if fs]
    for i in asked:
        pipe.hmget(keys[i], names[i])
    out: list[dict[bytes, bytes]] = [{} for _ in keys]
    for i, values in zip(asked, run(pipe) if asked else [], strict=True):
        # a field deleted between the two reads is left out, as HGETALL would have
        out[i] = {f: v for f, v in zip(names[i], values, strict=True) if v is not None}
    return out
