"""When each partition next needs a scheduler loop, kept current without polling.

The evaluator needs a partition when its earliest schedule comes due; the reaper when its
earliest lease expires or starting deadline passes. Each loop keeps those times (`Heads`) and
sleeps until the earliest. The times come from reading the index heads (when a partition is
taken over, after acting on it, and every `SAFETY_S`) and from notices on `<ns>:sched_wake`,
which the scripts publish when something becomes due *earlier* than the set's head
(`<kind>|<partition>|<ms>`: s = schedule, l = lease, d = starting deadline). A lost notice
costs at most `SAFETY_S`; an idle scheduler sends almost nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import random
import threading
from collections.abc import Callable
from typing import Any

import redis
from duetime.common.connection import refresh_topology, unavailable
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage, not_ready_reason
from duetime.common.outage import kind as outage_kind
from duetime.common.wake import parse_scheduler_notice, with_notice

log = get_logger("duetime.scheduler")

SAFETY_S = 30.0  # heads are re-read at least this often (notices are the fast path)
# a partition whose head read or script call failed on a damaged key is tried again this late
# (the others go on; an operator sees the key named in the log and in `duetime doctor`)
DAMAGED_RETRY_MS = 5_000


def head_ms(score: float) -> int | None:
    """A zset head's score as server ms. Scores are written by the scripts as integers; one
    edited by hand may be `-inf` (due since ever: act now, the script repairs it) or `+inf`
    (never: None, `duetime doctor` names it) -- never a crash of the loop reading it."""
    if math.isnan(score) or score == math.inf:
        return None
    if score == -math.inf:
        return 0
    return int(score)


class Heads:
    """Per partition, the earliest time (server ms) something in it comes due, or None."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.due: dict[int, int] = {}
        self._seq = 0
        self._noticed: dict[int, tuple[int, int]] = {}  # partition -> (seq, ms) of the last notice
        self.changed = threading.Event()

    def notice(self, p: int, ms: int) -> None:
        """Something in `p` comes due at `ms` (a script said so)."""
        with self._lock:
            self._seq += 1
            self._noticed[p] = (self._seq, ms)
            cur = self.due.get(p)
            if cur is None or ms < cur:
                self.due[p] = ms
                self.changed.set()

    def mark(self) -> int:
        """Call before reading heads; pass the mark to `set`."""
        with self._lock:
            return self._seq

    def set(self, p: int, ms: int | None, since: int) -> None:
        """What a read of `p`'s heads found; a notice that arrived after the read still counts."""
        with self._lock:
            ms = with_notice(ms, self._noticed.get(p), since)
            if ms is None:
                self.due.pop(p, None)
            else:
                self.due[p] = ms

    def drop_except(self, keep: builtins.set[int]) -> None:  # builtins: Heads has a set()
        with self._lock:
            for p in [p for p in self.due if p not in keep]:
                del self.due[p]

    def ready(self, until_ms: int, among: builtins.set[int] | None = None) -> list[int]:
        with self._lock:
            return sorted(p for p, ms in self.due.items()
                          if ms <= until_ms and (among is None or p in among))

    def earliest(self, among: builtins.set[int] | None = None) -> int | None:
        with self._lock:
            times = [ms for p, ms in self.due.items() if among is None or p in among]
        return min(times) if times else None


def about_a_key(exc: BaseException) -> bool:
    """An error about one key's content (a script refusing a damaged key, 'DAMAGED ...'; a
    key of the wrong type; a runtime error located in a script), not a refusal by the server
    (OOM, READONLY, a connection lost): those stop one partition, not the loop."""
    text = str(exc)
    return bool(isinstance(exc, redis.ResponseError) and (
        text.startswith(("DAMAGED", "WRONGTYPE")) or ".lua:" in text))


def report_health(part: str, listener: Listener, shards: Any = None) -> None:
    """A scheduler loop that just passed is ready if its wake channel is up too (an idle loop
    may not send a command for a while; the subscription notices a lost server at once), and,
    on a cluster, if at least one node it works on is not backing off (`shards`)."""
    from duetime.common import metrics

    reason = shards.unready() if shards is not None else None
    if reason:
        metrics.health.ready(part, False, reason)
    elif listener.subscribed.is_set():
        metrics.health.ready(part)
    else:
        metrics.health.ready(part, False, listener.error or "subscribing to the wake channel")


def backed_off(loop: str, outage: Outage, exc: BaseException, url: str, client: Any) -> float:
    """A scheduler loop's Redis call failed: the incident is logged and backed off by `outage`
    (common/outage.py, the helper the worker's loops use too), the loop says it is not ready
    and why, and a cluster client re-reads the topology unless the server refused the call
    (a dead primary: find its promoted replica). Returns how long to wait."""
    from duetime.common import metrics

    wait = outage.failed(exc)
    metrics.health.ready(loop, False, not_ready_reason(url, exc))
    if outage_kind(exc) != "refused":
        refresh_topology(client)
    return wait


class Listener(threading.Thread):
    """Subscribes to the scheduler wake channel and hands notices of `kinds` to `heads`;
    reconnects forever with jittered back-off, and sets `reread` after every (re)subscription,
    so the loop reads the heads again and notices sent while it was away are made up for."""

    def __init__(self, client: redis.Redis, url: str, channel: str | list[str], kinds: str | None,
                 heads: Heads, stopping: threading.Event,
                 relay: Callable[[int], None] | None = None) -> None:
        """`kinds` None: any message on the channel(s) only wakes the loop (`heads.changed`).
        `relay`: called with the partition of each relay notice (kind r: a dependency notice
        or link request waits in that partition's lists), then the loop is woken."""
        super().__init__(name=f"notices-{kinds or 'any'}", daemon=True)
        self.client, self.url, self.kinds = client, url, kinds
        self.channels = [channel] if isinstance(channel, str) else list(channel)
        self.heads = heads
        self.stopping = stopping
        self.relay = relay
        self.subscribed = threading.Event()
        self.reread = threading.Event()
        self.error = ""  # why the subscription was lost, while it is
        self._failures = 0  # subscriptions lost in a row

    def _pubsub(self) -> Any:
        """A subscription connection. On a cluster a PUBLISH reaches every node (the cluster
        bus carries it), so after a lost subscription the next one goes to the next node in
        the client's list, not again to the channel's node: a dead primary must not silence
        the notices of the live shards until its promotion."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is None or not self._failures:
            # redis-py leaves Redis.pubsub unannotated
            return self.client.pubsub(ignore_subscribe_messages=False)  # type: ignore[no-untyped-call, unused-ignore]
        known = sorted(self.client.get_nodes(), key=lambda n: n.name)  # type: ignore[attr-defined]
        node = known[self._failures % len(known)] if known else None
        return self.client.pubsub(node=node, ignore_subscribe_messages=False)  # type: ignore[no-untyped-call, unused-ignore]

    def run(self) -> None:
        delay = 0.1
        while not self.stopping.is_set():
            pubsub = self._pubsub()
            try:
                pubsub.subscribe(*self.channels)
                while not self.stopping.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        self.subscribed.set()
                        self.reread.set()
                        self.heads.changed.set()
                        delay = 0.1
                    elif msg["type"] == "message":
                        self._handle(msg["data"])
            except Exception as exc:
                if self.stopping.is_set():
                    return  # the process is closing its connections under us
                if not isinstance(exc, redis.RedisError | OSError):
                    raise
                self.subscribed.clear()
                self._failures += 1
                self.error = (str(unavailable(self.url, exc))
                              if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError)
                              else f"wake channel: {exc}")
                self.heads.changed.set()  # the loop reports itself not ready
                log.warning("scheduler wake channel lost; reconnecting", error=str(exc),
                            retry_in=round(delay, 2))
                self.stopping.wait(delay * (0.5 + random.random()))
                # a second at most: a subscription on a dead primary moves to a live node soon
                delay = min(delay * 2, 1.0)
            finally:
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()

    def _handle(self, data: bytes) -> None:
        """`<kind>|<partition>|<ms>`; anything else on the channel is ignored (a stray PUBLISH
        must not silence the notices)."""
        if self.kinds is None:
            self.heads.changed.set()
            return
        notice = parse_scheduler_notice(data)
        if notice is None:
            log.debug("ignored a message on the scheduler wake channel", data=repr(data[:80]))
        elif notice[0] == "r" and self.relay is not None:
            self.relay(notice[1])
            self.heads.changed.set()
        elif notice[0] in self.kinds:
            self.heads.notice(notice[1], notice[2])
