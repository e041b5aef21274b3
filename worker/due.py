"""What a worker knows of the earliest due time of every (partition, queue) it serves.

Three sources feed it: claim replies and a pipelined read of the sets' heads (authoritative
at the moment the server answered), and wake notices (a run just became a set's earliest).
A notice newer than a read still counts, so a read that crossed a notice cannot hide it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aredis
from duetime.common.connection import topology_error
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import REFUSED_CAP_S, retry_in
from duetime.common.wake import with_notice

log = get_logger("duetime.worker")

Key = tuple[int, str]  # (partition, queue)
# A partition/queue whose call failed is left alone for a jittered back-off from 0.1 s that
# doubles up to a second while the error is a failover's or a slot move's (a dead primary,
# CLUSTERDOWN until its replica is promoted: the work resumes within about a second of the
# promotion), up to 5 s for other refusals (OOM, a damaged key): common.outage.retry_in.


class DueTimes:
    def __init__(self, keys: Keyspace, queues: list[str], worker_id: str,
                 on_earlier: Callable[[], None], weights: dict[str, int] | None = None) -> None:
        self.keys, self.queues, self.worker_id = keys, list(queues), worker_id
        self._on_earlier = on_earlier
        self.next_due: dict[Key, float] = {}
        self.seq = 0  # counts notices; a read remembers the count it started at
        self._notices: dict[Key, tuple[int, float]] = {}
        self._held: dict[Key, float] = {}  # key -> monotonic time it may be claimed again
        self._failures: dict[Key, int] = {}  # key -> failed calls in a row
        self._rank = {q: i for i, q in enumerate(self.queues)}
        # fair order (docs/fairness.md): among keys due now, the least recently claimed first,
        # so a backlog in one partition (a tenant's home) cannot hold back another partition;
        # with weights, queues by virtual time (runs claimed / weight) instead of by rank
        self._weights = weights
        self._served: dict[Key, int] = {}
        self._turn = 0
        self._vt: dict[str, float] = dict.fromkeys(self.queues, 0.0)
        self._vnow = 0.0
        # key -> how many runs it is estimated to hold due, for keys whose last claim came
        # back full with more due (`sized`); a key not here is of unknown depth
        self.backlog: dict[Key, int] = {}

    def note(self, key: Key, due: float) -> None:
        """A notice that `key` has a run due at `due` (server ms)."""
        self.seq += 1
        self._notices[key] = (self.seq, due)
        cur = self.next_due.get(key)
        if cur is None or due < cur:
            self.next_due[key] = due
            self._on_earlier()

    def set(self, key: Key, due: float | None, since_seq: int) -> None:
        """Authoritative head read at the server; notices newer than the read still count."""
        due = with_notice(due, self._notices.get(key), since_seq)
        if due is None:
            self.next_due.pop(key, None)
        else:
            self.next_due[key] = due

    def due_now(self, horizon_ms: float) -> list[Key]:
        """Keys with a run due by `horizon_ms`, queues in the configured order, earliest first."""
        if self._held:
            t = time.monotonic()
            self._held = {k: u for k, u in self._held.items() if u > t}
        held, served = self._held, self._served
        keys = [(k, d) for k, d in self.next_due.items() if d <= horizon_ms and k not in held]
        due: list[tuple[float, int, float, tuple[int, str]]]  # (rank or virtual time, served, due, key)
        if self._weights is None:
            rank = self._rank
            due = [(rank[k[1]], served.get(k, 0), d, k) for k, d in keys]
        else:
            vt = self._vt
            active = {k[1] for k, _ in keys}
            for q in active:  # a queue coming back from idle starts at the current time
                if vt[q] < self._vnow:
                    vt[q] = self._vnow
            if active:
                # the current time is the least virtual time of the queues with work, read
                # here, before claiming: taken when a reply came back instead, a second claim
                # in flight on the same queue read the time its first one had already
                # advanced, and pushed the other queue's time forward as if it had been idle
                # (under high:5,low:1 the low queue got 23 % of the runs, not 17 %)
                self._vnow = min(vt[q] for q in active)
            due = [(vt[k[1]], served.get(k, 0), d, k) for k, d in keys]
        due.sort()
        return [k for *_, k in due]

    def served(self, key: Key) -> None:
        """A claim on `key` is on its way: it goes behind the other due keys."""
        self._turn += 1
        self._served[key] = self._turn

    def account(self, key: Key, claimed: int) -> None:
        """A claim on `key` came back with `claimed` runs: with weights, its queue's virtual
        time advances by claimed / weight (a claim that found nothing counts as one run)."""
        if self._weights is not None:
            q = key[1]
            self._vt[q] += max(claimed, 1) / self._weights[q]

    def sized(self, key: Key, asked: int, claimed: int, more: bool) -> None:
        """A claim on `key` asked for `asked` runs and got `claimed`; `more`: its reply said
        another run is due already (within claim-ahead). A full claim with more due means a
        backlog: the next claim there asks for twice as many (the estimate doubles while
        claims keep coming back full, so a deep backlog is claimed in the biggest calls the
        budget allows within a few claims). Anything else (fewer than asked: a drained set,
        or a limit holding runs back) and the key's depth is unknown again."""
        if more and claimed >= asked > 0:
            self.backlog[key] = max(self.backlog.get(key, 0), 2 * claimed)
        else:
            self.backlog.pop(key, None)

    def earliest(self) -> float | None:
        """The earliest due time of a key that may be claimed (server ms)."""
        dues = [d for k, d in self.next_due.items() if k not in self._held]
        return min(dues) if dues else None

    def next_release(self) -> float | None:
        """When a held key becomes claimable again (monotonic s)."""
        return min(self._held.values()) if self._held else None

    def refuse(self, key: Key, doing: str, exc: BaseException) -> bool:
        """A call for one partition and queue failed: leave that key alone for a back-off and
        go on with the others (one dead node or damaged key must not stop the whole worker).
        True when the error is a failover's or a slot move's: the caller re-reads the topology."""
        p, q = key
        n = self._failures[key] = self._failures.get(key, 0) + 1
        moving = topology_error(exc)
        wait = retry_in(exc, n)
        fields = dict(doing=doing, partition=p, queue=q, key=self.keys.due(p, q),
                      error=str(exc)[:300], retry_in=round(wait, 3), failures=n,
                      worker_id=self.worker_id)
        if moving and n == 1:  # one line per incident: a failover retries many times
            log.warning("partition unavailable (failover or slot move?); retrying it soon", **fields)
        elif not moving and (n == 1 or wait >= REFUSED_CAP_S / 2):  # at most every few s
            log.error("redis refused a call; skipping this partition and queue for a while",
                      **fields)
        self._held[key] = time.monotonic() + wait
        return moving

    def ok(self, key: Key) -> None:
        """A call for `key` went through: its back-off starts again from the bottom."""
        if self._failures.pop(key, None) is not None:
            p, q = key
            log.info("partition available again", partition=p, queue=q, worker_id=self.worker_id)

    async def refresh(self, client: aredis.Redis) -> bool:
        """Read the head of every due and retry set served, in one pipeline (the wake listener
        calls it whenever its subscription (re)connects); a head earlier than known wakes the
        claim loop. True when a read met a failover (see `refuse`)."""
        seq = self.seq
        pipe = client.pipeline(transaction=False)
        order: list[Key] = []
        for p in range(self.keys.partitions):
            for q in self.queues:
                pipe.zrange(self.keys.due(p, q), 0, 0, withscores=True)
                pipe.zrange(self.keys.retry(p, q), 0, 0, withscores=True)
                order.append((p, q))
        res: list[Any] = await pipe.execute(raise_on_error=False)
        moving = earlier = False
        for i, key in enumerate(order):
            due, retry = res[2 * i], res[2 * i + 1]
            failed = [r for r in (due, retry) if isinstance(r, Exception)]
            if failed:  # the head is unknown: keep what we knew, else try a claim to find out
                moving |= self.refuse(key, "reading due times", failed[0])
                self.next_due.setdefault(key, 0.0)
                continue
            heads = [s for part in (due, retry) for _, s in part]
            before = self.next_due.get(key)
            self.set(key, min(heads) if heads else None, seq)
            after = self.next_due.get(key)
            earlier |= after is not None and (before is None or after < before)
        if earlier:
            # a run the worker had not heard of (its notice came while the wake subscription
            # was down, e.g. across a Redis restart): the claim loop may be asleep until the
            # next refresh, so wake it now
            self._on_earlier()
        return moving
