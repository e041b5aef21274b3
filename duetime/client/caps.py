"""The namespace's payload cap, enforced by the server (lua/enqueue.lua).

`App(max_payload=...)` caps what one client sends; a client configured otherwise (or not
duetime at all) is not bound by it. A namespace-wide cap is kept where the operator reads it,
field `max_payload` of `<ns>:meta`, and copied into every partition's `T:caps` hash, because
enqueue.lua touches one partition's slot only (a cluster refuses a script that reads another
slot's key). Set and cleared with `duetime limits payload SIZE|none`.
"""

from __future__ import annotations

import re

import redis

from duetime.common.connection import translated
from duetime.common.errors import InvalidInput
from duetime.common.keys import Keyspace

FIELD = "max_payload"
MAX_CAP = 512 * 1024 * 1024  # a Redis string's own limit
_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    """'4096', '64KiB', '1MB' -> bytes; bad text, 0 or more than a Redis string: InvalidInput."""
    m = _SIZE.match(text.lower())
    if not m or m.group(2) not in _UNITS:
        raise InvalidInput(f"payload cap: not a size: {text[:40]!r} (bytes, or with KB, KiB, "
                           "MB, MiB)")
    size = int(m.group(1)) * _UNITS[m.group(2)]
    if not 1 <= size <= MAX_CAP:
        raise InvalidInput(f"payload cap: {text!r} is not between 1 byte and 512 MiB")
    return size


def set_payload_cap(client: redis.Redis, keys: Keyspace, url: str, size: int | None) -> None:
    """Cap every payload enqueued in the namespace at `size` bytes (None: no cap). The
    partitions first, then the record in `<ns>:meta`; an interrupted call is repaired by
    calling it again."""
    if size is not None and (isinstance(size, bool) or not 1 <= size <= MAX_CAP):
        raise InvalidInput(f"payload cap must be 1..{MAX_CAP} bytes, got {size!r}")
    pipe = client.pipeline(transaction=False)
    for p in range(keys.partitions):
        if size is None:
            pipe.hdel(keys.caps(p), FIELD)
        else:
            pipe.hset(keys.caps(p), FIELD, str(size))
    if size is None:
        pipe.hdel(keys.meta, FIELD)
    else:
        pipe.hset(keys.meta, FIELD, str(size))
    with translated(url):
        pipe.execute()


def read_payload_cap(client: redis.Redis, keys: Keyspace, url: str) -> int | None:
    """The cap as recorded in `<ns>:meta` (None: none, or a damaged field)."""
    with translated(url):
        raw = client.hget(keys.meta, FIELD)
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return int(text) if text.isdigit() and 1 <= int(text) <= MAX_CAP else None
