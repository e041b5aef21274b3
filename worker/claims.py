"""The claim loop: sleeps until the earliest known due time (or a wake-up), then claims due
runs in batches and hands them to the executor.

Claims run as tasks, up to CLAIMS_IN_FLIGHT at once, each reserving the slots it asked for:
the next claim travels while the previous batch starts and runs, so Redis time and Python
time overlap instead of adding up. While Redis is unreachable the loop makes no call at all
until its back-off ends.

On a cluster, one claim sends a pipeline per node, side by side: a dead primary fails only the
partitions it served, each of which is retried on a short back-off (worker/due.py) while the
client re-reads the slot map, so its replica is used within about a second of its promotion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aredis
from duetime.common import metrics
from duetime.common import transitions as tr
from duetime.common.connection import arefresh_topology
from duetime.common.keys import Keyspace
from duetime.common.logs import get as get_logger
from duetime.common.outage import Outage, bounded
from duetime.common.scripts import Scripts
from duetime.worker.clock import ServerClock
from duetime.worker.config import WorkerConfig
from duetime.worker.due import DueTimes, Key
from duetime.worker.errors import ANY_REDIS_ERROR, REDIS_ERRORS
from duetime.worker.execution import Executor
from redis.crc import key_slot

log = get_logger("duetime.worker")

CLAIMS_IN_FLIGHT = 2
CLAIM_MIN_SHARE = 16
CLOCK_SYNC_S = 60.0
EARLY_HOLD_S = 0.001  # a claim found nothing due: our estimate of server time ran ahead by a hair


def plan_claim(keys: Sequence[Key], free: int,
               backlog: Mapping[Key, int]) -> list[tuple[Key, int]]:
    """How many runs one claim for `free` slots asks of each due key; `keys` in the fair
    order of DueTimes.due_now, `backlog` what the worker estimates some keys hold
    (DueTimes.sized: their last claim came back full, with more due).

    A claim.lua call costs Redis a large fixed amount whatever it claims, so a key with a
    backlog is asked for all of it that the budget allows: few keys to a claim, and big
    calls. Keys of unknown depth share evenly, at least CLAIM_MIN_SHARE each, as they always
    did (a backlog spread over many partitions is found in a few calls, not one per
    partition). Queues keep their order (strict priority, or weights' virtual time); within
    a queue the keys of unknown depth go first, with up to half of what is left when keys
    with a backlog wait too: a lone run, or another tenant's, is in the next claim rather
    than behind the big keys' rotation, and the big keys still get at least half of it."""
    if free <= 0 or not keys:
        return []
    even = max(min(free, CLAIM_MIN_SHARE), -(-free // len(keys)))
    plan: list[tuple[Key, int]] = []
    left = free
    for queue in dict.fromkeys(q for _, q in keys):  # queues in order of their first key
        group = [k for k in keys if k[1] == queue]
        deep = [k for k in group if k in backlog]
        room = left - left // 2 if deep else left  # for the keys of unknown depth
        for key in group:
            if key in backlog or room <= 0:
                continue
            n = min(even, room)
            plan.append((key, n))
            room -= n
            left -= n
        for key in deep:
            if left <= 0:
                break
            n = min(backlog[key], left)
            plan.append((key, n))
            left -= n
        if left <= 0:
            break
    return plan


class Claimer:
    def __init__(self, client: aredis.Redis, scripts: Scripts, keys: Keyspace, cfg: WorkerConfig,
                 due: DueTimes, clock: ServerClock, executor: Executor, wake: asyncio.Event) -> None:
        self.client, self.scripts, self.keys, self.cfg = client, scripts, keys, cfg
        self.due, self.clock, self.executor, self.wake = due, clock, executor, wake
        # capped at a second: after a failover, work resumes within about a second
        self.outage = Outage("claim loop", log, cap_s=1.0, worker_id=cfg.worker_id)
        self._claims: set[asyncio.Task[None]] = set()
        # claims not yet back, counted as they end (a task leaves _claims a step later, in
        # its done callback: a poke in between would see a claim that has already ended)
        self._in_flight = 0
        self._reserved = 0  # slots promised to claims in flight
        self._hold_until = 0.0  # monotonic time before which no Redis call is made
        self._bug_backoff = 0.1
        self._share = -(-cfg.concurrency // CLAIMS_IN_FLIGHT)
        self._stopping: asyncio.Event | None = None  # run()'s, while it runs
        self._claiming: dict[Key, int] = {}  # keys with a claim on its way -> how many

    async def run(self, stopping: asyncio.Event, until_idle: bool = False) -> None:
        """Claim until `stopping` is set; with `until_idle`, also return once `idle()` says so
        twice with nothing done in between (burst mode, see Worker.run)."""
        cfg, due, clock = self.cfg, self.due, self.clock
        last_refresh = last_clock = time.monotonic()
        seen = -1  # the work done when the worker last found itself idle (burst mode)
        self._stopping = stopping
        while not stopping.is_set():
            hold = self._hold_until - time.monotonic()
            if hold > 0:
                await self._sleep(hold)
                continue
            free = cfg.concurrency - len(self.executor.inflight) - self._reserved
            can_claim = free > 0 and self._in_flight < CLAIMS_IN_FLIGHT
            keys = due.due_now(clock.now_ms() + cfg.claim_ahead_ms) if can_claim else []
            if keys:
                keys = self._claimable(keys)
                if keys:
                    self._spawn(keys, free)
                    continue
                can_claim = False  # each due key has a claim on its way: its end wakes us
            try:
                if until_idle and self.idle():
                    done = self.executor.processed + self.executor.reporter.recorded
                    if done == seen:
                        break  # idle at a fresh read of the heads, and nothing done since
                    # what the worker knows may predate its last reports (a retry due now
                    # is told by a notice still on its way): read the heads, then look again
                    if await due.refresh(self.client):
                        await arefresh_topology(self.client)
                    seen = done  # only once the heads were read (a failed read raises above)
                    last_refresh = time.monotonic()
                    self.outage.ok()
                    continue
                if time.monotonic() - last_refresh >= cfg.refresh_s:
                    if await due.refresh(self.client):
                        await arefresh_topology(self.client)
                    last_refresh = time.monotonic()
                    self.outage.ok()
                    continue
                if time.monotonic() - last_clock >= CLOCK_SYNC_S:
                    await clock.sync(self.client)
                    last_clock = time.monotonic()
                    continue  # slots may have freed meanwhile: look again before sleeping
            except REDIS_ERRORS as exc:
                self._hold(self.outage.failed(exc))
                await arefresh_topology(self.client)
                continue
            except ANY_REDIS_ERROR as exc:
                log.error("redis refused a call of the claim loop", error=bounded(exc),
                          worker_id=cfg.worker_id)
                self._hold(1.0)
                continue
            timeout = cfg.refresh_s - (time.monotonic() - last_refresh)
            if can_claim:
                earliest = due.earliest()
                if earliest is not None:
                    timeout = min(timeout, (earliest - cfg.claim_ahead_ms - clock.now_ms()) / 1000)
                release = due.next_release()
                if release is not None:  # a held key becomes claimable again
                    timeout = min(timeout, release - time.monotonic())
            if timeout > 0:
                await self._sleep(timeout)
        if self._claims:
            await asyncio.gather(*self._claims, return_exceptions=True)

    def poke(self) -> None:
        """Slots were just freed in the middle of a step of the event loop (a claimed batch's
        runs ended: Executor's batch end): send the next claims from here, now. The claim loop
        would only run after everything ready before it, the next batch's runs included: the
        two claims in flight then go out together, come back together, and Redis and the
        worker take turns idling (a drain ran at ~60 % of the slower one's rate)."""
        stopping = self._stopping
        if stopping is None or stopping.is_set() or time.monotonic() < self._hold_until:
            return
        cfg = self.cfg
        while self._in_flight < CLAIMS_IN_FLIGHT:
            free = cfg.concurrency - len(self.executor.inflight) - self._reserved
            if free <= 0:
                break
            keys = self._claimable(self.due.due_now(self.clock.now_ms() + cfg.claim_ahead_ms))
            if not keys:
                break
            self._spawn(keys, free)
        self.wake.set()

    def _claimable(self, keys: list[Key]) -> list[Key]:
        """`keys` but those with a claim on its way, unless known to hold more than it can
        bring back (DueTimes.backlog): a second claim for a lone run found it gone, came back
        empty and held the loop a millisecond (W2: two claim calls a run, one of them empty)."""
        claiming = self._claiming
        if not claiming:
            return keys
        backlog = self.due.backlog
        return [k for k in keys if k not in claiming or k in backlog]

    def idle(self) -> bool:
        """Nothing of this worker's under way and nothing it knows of due now: no claim in
        flight, no attempt running (or waiting for its due time), no report unrecorded, and no
        (partition, queue) with a run due within claim-ahead, a key held back after a refused
        call included (it is tried again). A run a limit holds back counts at the time the
        claim said the limit may let it through."""
        if self._in_flight or self._reserved or self.executor.inflight \
                or self.executor.reporter.pending():
            return False
        horizon = self.clock.now_ms() + self.cfg.claim_ahead_ms
        return not any(d <= horizon for d in self.due.next_due.values())

    async def _sleep(self, timeout: float) -> None:
        """Until a wake-up (a due time came in, a slot or claim ended, stop) or the timeout,
        which is a timer setting the wake-up: `asyncio.wait_for` would wrap the wait in a task
        of its own, at ~3x the cost, and the loop sleeps about once per claimed batch."""
        self.wake.clear()
        timer = asyncio.get_running_loop().call_later(timeout, self.wake.set)
        try:
            await self.wake.wait()
        finally:
            timer.cancel()

    def _hold(self, seconds: float) -> None:
        self._hold_until = time.monotonic() + seconds

    def _spawn(self, keys: list[Key], free: int) -> None:
        """A claim over `keys` (fair order, see DueTimes.due_now), planned here, at once
        (`plan_claim`): its keys go behind the other due ones and count as being claimed
        (`_claimable`) before the loop looks again, so the next claim, spawned right after it
        in the same pass, goes elsewhere."""
        # a claim takes at most its share of the slots, so another can be in flight meanwhile
        free = min(free, self._share)
        plan = plan_claim(keys, free, self.due.backlog)
        claiming = self._claiming
        for key, _ in plan:
            self.due.served(key)
            claiming[key] = claiming.get(key, 0) + 1
        self._reserved += free
        task = asyncio.create_task(self._claim_task(plan, free))
        self._claims.add(task)
        self._in_flight += 1
        task.add_done_callback(self._claims.discard)

    async def _claim_task(self, plan: list[tuple[Key, int]], free: int) -> None:
        try:
            claimed = await self._claim(plan)
            self.outage.ok()
            self._bug_backoff = 0.1
            if not claimed:
                self._hold(EARLY_HOLD_S)
        except REDIS_ERRORS as exc:
            self._hold(self.outage.failed(exc))
        except Exception:  # noqa: BLE001 - a bug here must not turn into a hot claim loop
            log.exception("claim failed", worker_id=self.cfg.worker_id, retry_in=self._bug_backoff)
            self._hold(self._bug_backoff)
            self._bug_backoff = min(self._bug_backoff * 2, 5.0)
        finally:
            claiming = self._claiming
            for key, _ in plan:
                n = claiming[key] - 1
                if n:
                    claiming[key] = n
                else:
                    del claiming[key]
            self._reserved -= free
            self._in_flight -= 1
            self.wake.set()

    async def _claim(self, plan: list[tuple[Key, int]]) -> int:
        """One pipelined claim of `plan` ((key, runs asked for), in order): sent, its replies
        read and their runs started; → how many runs were claimed."""
        seq = self.due.seq
        groups = self._by_node(plan)
        replies: list[Any]
        if len(groups) == 1:  # one node (always, on a plain server): no gather, no task for it
            try:
                replies = [await self._send(groups[0])]
            except Exception as exc:  # noqa: BLE001 - as gather(return_exceptions=True) gives it
                replies = [exc]
        else:
            replies = await asyncio.gather(*(self._send(g) for g in groups),
                                           return_exceptions=True)
            if any(isinstance(r, asyncio.CancelledError) for r in replies):
                raise asyncio.CancelledError
        cluster = hasattr(self.client, "nodes_manager")
        if not cluster and all(isinstance(r, REDIS_ERRORS) for r in replies):
            # a plain server that cannot be reached: the whole loop backs off, one incident
            # in the log. On a cluster the partitions of the dead node are held instead, so
            # the next claim goes to the live nodes' partitions (the first keys of a plan take
            # its whole budget: holding the loop would have retried only the dead ones)
            raise replies[0]
        outcomes: list[tuple[Key, int, Any]] = []  # (key, runs asked for, its reply)
        for g, res in zip(groups, replies, strict=True):
            if isinstance(res, BaseException):  # the whole node: every call of it failed
                outcomes += [(key, n, res) for key, n in g]
            else:
                outcomes += [(key, n, r) for (key, n), r in zip(g, res, strict=True)]
        now = self.clock.now_ms()
        horizon = now + self.cfg.claim_ahead_ms
        claimed = 0
        start = self.executor.start_batch
        moving = False
        for (p, q), asked, res in outcomes:
            if isinstance(res, BaseException):
                moving |= self.due.refuse((p, q), "claiming", res)
                continue
            self.due.ok((p, q))
            reply = tr.parse_claim(res)
            self.due.set((p, q), reply.next_due_ms, seq)
            self.due.account((p, q), len(reply.runs))
            nxt = reply.next_due_ms
            self.due.sized((p, q), asked, len(reply.runs), nxt is not None and nxt <= horizon)
            if reply.runs:
                start(p, q, reply.runs, now)
                claimed += len(reply.runs)
                metrics.child(metrics.CLAIMED, q).inc(len(reply.runs))
            if reply.missed:
                metrics.MISSED.inc(reply.missed)
            if reply.skipped:
                metrics.SKIPPED.inc(reply.skipped)
            if reply.held_concurrency:
                metrics.child(metrics.RUNS_LIMITED, "concurrency").inc(reply.held_concurrency)
            if reply.held_rate:
                metrics.child(metrics.RUNS_LIMITED, "rate").inc(reply.held_rate)
        if moving:
            await arefresh_topology(self.client)
        return claimed

    def _by_node(self, plan: list[tuple[Key, int]]) -> list[list[tuple[Key, int]]]:
        """The plan split by the cluster node serving each partition (as the client knows
        the slot map); one group on a plain server."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is None or len(plan) == 1:
            return [plan]
        groups: dict[str, list[tuple[Key, int]]] = {}
        for key, n in plan:
            try:
                node = nodes.get_node_from_slot(key_slot(self.keys.due(*key).encode())).name
            except Exception:  # noqa: BLE001 - a slot the client has no node for: its own group
                node = f"?{key}"
            groups.setdefault(node, []).append((key, n))
        return list(groups.values())

    async def _send(self, group: list[tuple[Key, int]]) -> list[Any]:
        """One pipeline of claim.lua calls; per-call errors come back as values (the runs
        other calls claimed must still start)."""
        cfg = self.cfg
        pipe = self.client.pipeline(transaction=False)
        for (p, q), n in group:
            ks, args = tr.claim(self.keys, p, q, cfg.worker_id, n, cfg.lease_ms, cfg.claim_ahead_ms)
            await self.scripts.claim(keys=ks, args=args, client=pipe)
        return await pipe.execute(raise_on_error=False)
