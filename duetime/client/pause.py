"""Queue pause: a paused queue still accepts enqueues, but no worker claims from it.

A claim touches one partition (one cluster slot), so a fleet-wide pause must be visible in
each: `<ns>:paused` keeps each pause as made (queue -> JSON {note, at}, for listing), and
every partition's `T:paused` hash holds the same field, which claim.lua reads (one EXISTS
with its other optional keys while nothing is paused: the hot path stays flat). Both live in
Redis, so a pause survives worker, scheduler and (with persistence) server restarts.

Pause writes the partitions first, then the record; resume clears the partitions first, then
the record, and wakes the workers (a paused claim told them to look again a second later,
the wake makes it at once). An interrupted call is repaired by calling it again, and the
record still lists the queue until a resume has reached every partition.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from duetime.common.connection import translated
from duetime.common.errors import InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.names import check_name
from duetime.common.wake import worker_wake

MAX_NOTE = 500


@dataclass(frozen=True)
class QueuePause:
    """One paused queue: why (`note`) and since when (`at_ms`, the pausing client's clock)."""

    queue: str
    note: str
    at_ms: int


def _check(queue: object, note: object = "") -> tuple[str, str]:
    q = check_name("queue", queue)
    if not isinstance(note, str):
        raise InvalidInput(f"pause note must be a string, got {type(note).__name__}")
    if len(note) > MAX_NOTE:
        raise InvalidInput(f"pause note is {len(note)} characters; at most {MAX_NOTE}")
    return q, note


class QueuePauses:
    """Pause, resume and list the queues of a namespace."""

    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def pause(self, queue: str, note: str = "") -> QueuePause:
        """Stop every worker claiming from `queue` from its next claim on; enqueues go on.
        Pausing a paused queue replaces its note."""
        q, note = _check(queue, note)
        rec = QueuePause(q, note, int(time.time() * 1000))
        value = json.dumps({"note": rec.note, "at": rec.at_ms})
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.hset(self.keys.paused(p), q, value)
        pipe.hset(self.keys.paused_config, q, value)
        with translated(self.url):
            pipe.execute()
        return rec

    def resume(self, queue: str) -> bool:
        """Let workers claim from `queue` again, at once → whether it was paused."""
        q, _ = _check(queue)
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.hdel(self.keys.paused(p), q)
        pipe.hdel(self.keys.paused_config, q)
        with translated(self.url):
            res = pipe.execute()
            now = int(time.time() * 1000)
            for p in range(self.keys.partitions):  # one by one: a cluster pipeline refuses it
                self.client.publish(self.keys.wake_channel, worker_wake(p, q, now))
        return any(int(n) for n in res)

    def list(self) -> list[QueuePause]:
        """The paused queues, by name. A damaged record is listed with what could be read."""
        with translated(self.url):
            raw = self.client.hgetall(self.keys.paused_config)
        out = []
        for k, v in raw.items():
            name = k.decode(errors="replace") if isinstance(k, bytes) else str(k)
            note, at = "", 0
            try:
                d = json.loads(v)
                note, at = str(d.get("note", "")), int(d.get("at", 0))
            except (ValueError, TypeError, AttributeError):
                note = "(pause record unreadable)"
            out.append(QueuePause(name, note, at))
        return sorted(out, key=lambda x: x.queue)
