"""A stateful property test of the run lifecycle against a real server.

Hypothesis drives the scripts (through common/transitions.py and common/scripts.py, as a
worker, the reaper and an operator do) in random orders: enqueue, claim, heartbeat, complete,
fail (error, fatal, cancel), a retry made due, lease expiry on purpose (the lease's score set in
the past, never a sleep), reap, cancel and replay, with holders kept after they report so stale
and repeated reports happen. A model predicts every reply; after every step each run must sit
in exactly the index its state implies, fences only grow, no run is lost, and a stale holder's
result is refused.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import duetime
from duetime.embedded import EmbeddedServer
from duetime.ops.admin import replay_id

P = 2  # partitions: enough for runs to be spread, few enough to collide
app = duetime.App(partitions=P)


# a backoff of an hour: a retry comes due only when a rule says so (time is the test's)
@app.task(name="sm.idem", retries=2, backoff=("1h", "2h"))
def idem() -> None:
    """Idempotent: an expired lease is retried."""


@app.task(name="sm.once", idempotent=False, retries=2, backoff=("1h", "2h"))
def once() -> None:
    """Not idempotent: an expired lease makes the run uncertain."""


INDEX = {"scheduled": "due", "running": "leases", "retrying": "retry", "succeeded": "done",
         "cancelled": "done", "dead": "dead", "uncertain": "uncertain"}


@dataclass
class Model:
    state: str = "scheduled"
    fence: int = 0
    attempt: int = 0
    max_attempts: int = 3
    idempotent: bool = True
    cancel_requested: bool = False
    expired: bool = False  # its lease was expired on purpose
    ended_by: str = ""  # how the current fence's attempt ended, when a report ended it
    replayed: bool = False
    late_marked: bool = False  # a stale report of the current fence marked its attempt late
    holders: set[int] = field(default_factory=set)


class Lifecycle(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        app.configure(redis_url=self.url, namespace=f"sm{uuid.uuid4().hex[:8]}")
        self.k = app.keys
        self.r = app.store.ready()
        self.s = Scripts(self.r)
        self.runs: dict[str, Model] = {}
        self.holders: list[tuple[str, int]] = []  # (run id, fence) of every claim ever made

    def teardown(self) -> None:
        keys = list(self.r.scan_iter(f"{self.k.namespace}:*", count=1000))
        if keys:
            self.r.delete(*keys)

    # -- helpers ---------------------------------------------------------------------
    def p(self, run_id: str) -> int:
        return self.k.partition_of_run(run_id)

    def actual(self, run_id: str) -> dict[str, str]:
        h = self.r.hgetall(self.k.run(self.p(run_id), run_id))
        return {a.decode(): b.decode(errors="replace") for a, b in h.items()}

    def index_of(self, run_id: str) -> set[str]:
        p = self.p(run_id)
        named = {"due": self.k.due(p, "default"), "retry": self.k.retry(p, "default"),
                 "leases": self.k.leases(p), "dead": self.k.dead(p),
                 "uncertain": self.k.uncertain(p), "done": self.k.done(p)}
        return {n for n, key in named.items() if self.r.zscore(key, run_id) is not None}

    def token(self, run_id: str, fence: int) -> str:
        return f"w{self.p(run_id)}:{fence}"

    # -- rules ----------------------------------------------------------------------
    @rule(n=st.integers(1, 3), idempotent=st.booleans())
    def enqueue(self, n: int, idempotent: bool) -> None:
        task = idem if idempotent else once
        for _ in range(n):  # keyed: the same ids (and partitions) every time a case is replayed
            rid = app.enqueue(task, key=f"r{len(self.runs)}")
            self.runs[rid] = Model(idempotent=idempotent)

    @rule(p=st.integers(0, P - 1))
    def claim(self, p: int) -> None:
        keys, args = tr.claim(self.k, p, "default", f"w{p}", 1000, 60_000)
        reply = tr.parse_claim(self.s.claim(keys=keys, args=args))
        claimed = {c.run_id for c in reply.runs}
        for c in reply.runs:
            m = self.runs[c.run_id]
            assert m.state in ("scheduled", "retrying"), (c.run_id, m.state)
            assert c.fence > m.fence, "fences only grow"
            m.state, m.fence, m.attempt = "running", c.fence, m.attempt + 1
            m.expired, m.ended_by, m.late_marked = False, "", False
            assert c.attempt == m.attempt
            self.holders.append((c.run_id, c.fence))
        order = {rid: i for i, rid in enumerate(self.runs)}
        self.holders.sort(key=lambda h: (order[h[0]], h[1]))  # not the claim's (timing) order
        for rid, m in self.runs.items():
            if self.p(rid) != p or rid in claimed:
                continue
            assert m.state != "scheduled", f"{rid} was due and not claimed"
            if m.state == "retrying" and m.cancel_requested and self.actual(rid)["state"] == "cancelled":
                m.state = "cancelled"  # a cancel requested while it ran wins over its retry

    @precondition(lambda self: any(m.state == "retrying" for m in self.runs.values()))
    @rule(data=st.data())
    def retry_comes_due(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([r for r, m in self.runs.items() if m.state == "retrying"]))
        self.r.zadd(self.k.retry(self.p(rid), "default"), {rid: 0})  # its backoff has passed

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        rid, fence = data.draw(st.sampled_from(self.holders))
        m = self.runs[rid]
        keys, args = tr.heartbeat(self.k, self.p(rid), 60_000, [(rid, self.token(rid, fence))])
        [got] = self.s.heartbeat(keys=keys, args=args)
        held = m.state == "running" and m.fence == fence
        assert got == ((2 if m.cancel_requested else 1) if held else 0), (rid, fence, m, got)
        if held:
            m.expired = False  # the lease was renewed

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        rid, fence = data.draw(st.sampled_from(self.holders))
        m = self.runs[rid]
        keys, args = tr.complete(self.k, self.p(rid), [(rid, fence)])
        [got] = [x.decode() for x in self.s.complete(keys=keys, args=args)]
        if m.fence == fence and m.state == "running":
            want, m.state, m.ended_by = "succeeded", "succeeded", "succeeded"
        elif m.fence == fence and m.state == "succeeded":
            want = "succeeded"  # the same report again: the same answer, nothing changes
        elif m.fence == fence and m.state in ("retrying", "uncertain"):
            want, m.state, m.ended_by = "late_succeeded", "succeeded", "succeeded"
        else:
            want = "stale"  # a stale holder's result is refused
            m.late_marked = m.late_marked or m.fence == fence
        assert got == want, (rid, fence, m, got)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), mode=st.sampled_from(["error", "fatal", "cancel"]))
    def fail(self, data: st.DataObject, mode: str) -> None:
        rid, fence = data.draw(st.sampled_from(self.holders))
        m = self.runs[rid]
        keys, args = tr.fail(self.k, self.p(rid), "default", rid, fence, "boom", mode, 0, 0.5)
        got = self.s.fail(keys=keys, args=args)[0].decode()
        if (m.fence == fence and m.state != "running" and m.ended_by in ("failed", "cancelled")
                and not m.late_marked):
            want = m.state  # the same report again
        elif m.fence != fence or m.state != "running":
            want = "stale"
            m.late_marked = m.late_marked or m.fence == fence
        elif mode == "cancel":
            want, m.ended_by = "cancelled", "cancelled"
        else:
            dead = mode == "fatal" or m.attempt >= m.max_attempts
            want, m.ended_by = ("dead" if dead else "retrying"), "failed"
        if want != "stale" and m.ended_by and m.state == "running":
            m.state = want
        assert got == want, (rid, fence, mode, m, got)

    @precondition(lambda self: any(m.state == "running" for m in self.runs.values()))
    @rule(data=st.data())
    def lease_expires(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([r for r, m in self.runs.items() if m.state == "running"]))
        self.r.zadd(self.k.leases(self.p(rid)), {rid: 0})  # the lease's end, set in the past
        self.runs[rid].expired = True

    @rule()
    def reap(self) -> None:
        for p in range(P):
            keys, args = tr.reap(self.k, p, 1000, 0.5, 0)
            self.s.reap(keys=keys, args=args)
        for m in self.runs.values():
            if m.state == "running" and m.expired:
                m.ended_by, m.expired = "unknown", False
                if m.cancel_requested:
                    m.state = "cancelled"
                elif not m.idempotent:
                    m.state = "uncertain"
                elif m.attempt >= m.max_attempts:
                    m.state = "dead"
                else:
                    m.state = "retrying"

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(list(self.runs)))
        m = self.runs[rid]
        keys, args = tr.cancel(self.k, self.p(rid), "default", rid, "operator")
        got = self.s.cancel(keys=keys, args=args)[0].decode()
        if m.state == "running":
            want, m.cancel_requested = "requested", True
        elif m.state in ("scheduled", "retrying"):
            want, m.state = "cancelled", "cancelled"
        elif m.state == "uncertain":
            want = "uncertain"
        else:
            want = "finished"
        assert got == want, (rid, m, got)

    @precondition(lambda self: any(m.state in ("dead", "uncertain") for m in self.runs.values()))
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([r for r, m in self.runs.items()
                                         if m.state in ("dead", "uncertain")]))
        m = self.runs[rid]
        new = replay_id(self.k, rid)
        keys, args = tr.replay(self.k, self.p(rid), "default", rid, new, False)
        status, detail = (x.decode() for x in self.s.replay(keys=keys, args=args))
        if m.replayed:
            assert status == "already"
            return
        assert status == "created" and detail == new, (rid, m, status, detail)
        m.state, m.replayed = "dead", True
        self.runs[new] = Model(idempotent=m.idempotent)

    # -- after every step ------------------------------------------------------------
    @invariant()
    def every_run_in_exactly_its_index(self) -> None:
        for rid, m in self.runs.items():
            a = self.actual(rid)
            assert a, f"run {rid} lost"
            assert a["state"] == m.state, (rid, a, m)
            assert int(a.get("fence") or 0) == m.fence, "fences only grow, and only by a claim"
            want = "done" if m.replayed else INDEX[m.state]
            assert self.index_of(rid) == {want}, (rid, m.state, self.index_of(rid))


@pytest.mark.parametrize("kind", ["redis", "valkey"])
def test_the_run_lifecycle_keeps_its_indexes_and_fences(servers: dict[str, EmbeddedServer],
                                                        kind: str) -> None:
    Lifecycle.url = servers[kind].url
    try:
        run_state_machine_as_test(Lifecycle, settings=settings(
            max_examples=25, stateful_step_count=30, deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow]))
    finally:
        app.close()
