"""Upgrading a live namespace from the previous layouts (docs/keys.md "Namespace format").

Format 1 to 2 (the succeeded attempt inline in the run hash): the format-1 release's scripts
(tests/fixtures/format1.tar.gz, assembled verbatim from its lua/) write a namespace with runs
due, running with leases held, retrying, dead and finished; then this version and that one
serve it side by side, as in a rolling upgrade, while new runs keep arriving. Nothing is lost
or run twice, and every reader sees one history whichever version wrote it.

Format 2 to 3 (a run record leaves out the fields at their default): the format-2 release's
scripts (tests/fixtures/format2.tar.gz) and this version serve a format-2 namespace side by
side, this version still writing format 2; `duetime migrate` refuses while a worker of the
older release is live, then moves the namespace on, and this version's compact records are
claimed, retried with the default back-off and finished, beside the runs of both layouts.

Format 3 to 4 (a due time asked for as an instant is kept to the microsecond): the format-3
release's scripts (tests/fixtures/format3.tar.gz), read as that release read a claim (every due
time a whole ms), serve a format-3 namespace beside this version, which rounds such a due time
up there; once `duetime migrate` moves it on, the record, the due set and the claim carry the
instant itself, and no attempt starts before it.
"""

from __future__ import annotations

import os
import tarfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from duetime.common import transitions as tr
from duetime.common.codec import pack_payload
from duetime.common.connection import FORMAT
from duetime.common.scripts import Scripts
from duetime.common.time.parse import from_ms, to_ms, to_us

from duetime import FormatTooNew
from duetime.client.runs import task_fields
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.opkit import cli

pytestmark = pytest.mark.scripts

# the previous release's scripts as it shipped them: an archive, not source files, because they
# stand for code already deployed and are never edited (tests/fixtures/format1.md says where
# they come from)
OLD = Path(__file__).resolve().parent.parent / "fixtures" / "format1.tar.gz"
OLD2 = Path(__file__).resolve().parent.parent / "fixtures" / "format2.tar.gz"
OLD_CLAIM_FIELDS = 16  # the previous claim.lua's reply per run (its CLAIM_RUN_FIELDS)


class Version:
    """One release's transitions, driven as its workers and producers call them."""

    def __init__(self, r, k, scripts, old: bool, worker: str) -> None:
        self.r, self.k, self.s, self.old, self.worker = r, k, scripts, old, worker

    def enqueue(self, p: int, ids: list[str]) -> int:
        keys, args = tr.enqueue(self.k, p, "default", task_fields(basic.noop.spec, "default"),
                                [(i, "", 0, ["payload", pack_payload([], {})]) for i in ids],
                                fresh=not self.old, forms=not self.old)
        if self.old:
            del args[4]  # the previous enqueue.lua had no `fresh` mark
        return int(self.s["enqueue"](keys=keys, args=args))

    def claim(self, p: int, n: int) -> list:
        keys, args = tr.claim(self.k, p, "default", self.worker, n, 60_000)
        res = self.s["claim"](keys=keys, args=args)
        if self.old:  # the previous release's reply: 16 values per run, read by its own code
            return [SimpleNamespace(run_id=res[i].decode(), fence=int(res[i + 1]))
                    for i in range(tr.CLAIM_HEADER, len(res), OLD_CLAIM_FIELDS)]
        return tr.parse_claim(res).runs

    def complete(self, p: int, runs: list) -> list[str]:
        if self.old:  # the previous complete.lua read 4 values per run (no `bare` mark)
            keys, args = tr.complete(self.k, p, [(c.run_id, c.fence) for c in runs], forms=False)
            args = args[:3] + [a for j, a in enumerate(args[3:]) if j % 5 < 4]
        else:  # as this version's worker reports: the claim's bare mark and attempt
            keys, args = tr.complete(self.k, p, [
                (c.run_id, c.fence, b"", "", getattr(c, "bare", False), getattr(c, "attempt", 0))
                for c in runs])
        return [x.decode() for x in self.s["complete"](keys=keys, args=args)]

    def fail(self, p: int, c, mode: str) -> str:
        keys, args = tr.fail(self.k, p, "default", c.run_id, c.fence, "boom", mode, 0, 0.5)
        return self.s["fail"](keys=keys, args=args)[0].decode()


def _old_source(name: str, memory: bool, archive_path: Path = OLD) -> str:
    """A previous release's script; without its `#!lua` line for the in-memory backend
    (as common/scripts.py `plain` loads it there)."""
    with tarfile.open(archive_path) as archive:
        member = archive.extractfile(f"{name}.lua")
        assert member is not None, f"{name}.lua missing from {archive_path}"
        src = member.read().decode()
    return "\n" + src.split("\n", 1)[1] if memory and src.startswith("#!") else src


def versions(app, r) -> tuple[Version, Version]:
    memory = app.redis_url.startswith("memory:")
    old = {n: r.register_script(_old_source(n, memory))
           for n in ("enqueue", "claim", "complete", "fail")}
    new = Scripts(r)
    return (Version(r, app.keys, old, True, "old-worker"),
            Version(r, app.keys, {n: getattr(new, n) for n in old}, False, "new-worker"))


def _each_run_once(app, everyone: set[str], dead: set[str], retried: set[str],
                   succeeded: Counter, claims: Counter) -> None:
    """0 lost, 0 run twice: every run but the dead ones succeeded exactly once, and was claimed
    once (twice for those an attempt failed with a retry); one history per run, whichever
    version ended which attempt, read with every field this version reads."""
    assert set(succeeded) == everyone - dead
    assert all(n == 1 for n in succeeded.values())
    assert {i: n for i, n in claims.items() if n != (2 if i in retried else 1)} == {}
    for i in everyone - dead:
        run = app.get_run(i)
        assert run.state == "succeeded" and run.created is not None, (i, run.state)
        assert run.queue == "default" and run.max_attempts == 4, (i, run.queue, run.max_attempts)
        outcomes = [a.outcome for a in run.attempts]
        assert outcomes == (["failed", "succeeded"] if i in retried else ["succeeded"]), outcomes
        assert run.attempts[-1].fence == run.fence and run.attempts[-1].ended is not None


def test_a_live_namespace_upgrades_with_old_and_new_workers_side_by_side(app, r):
    k = app.keys
    old, new = versions(app, r)
    # the previous release's first use: its <ns>:meta has no `format`
    r.hset(k.meta, mapping={"partitions": k.partitions, "version": "1", "created_ms": 1})
    ids: dict[int, list[str]] = {}
    for n in range(8 * k.partitions):  # ids that land in every partition, as random ids do
        rid = f"{n:020x}"
        ids.setdefault(k.partition_of_run(rid), []).append(rid)
    for p, group in ids.items():
        assert old.enqueue(p, group) == len(group)

    # the old fleet at work: per partition one finished, one retrying, one dead, two running
    # (leases held by the old worker), the rest due
    held: dict[int, list] = {}
    retried, dead = set(), set()
    claims: Counter[str] = Counter()
    succeeded: Counter[str] = Counter()
    for p in ids:
        runs = old.claim(p, 5)
        claims.update(c.run_id for c in runs)
        done, again, fatal, *rest = runs
        assert old.complete(p, [done]) == ["succeeded"]
        succeeded[done.run_id] += 1
        assert old.fail(p, again, "retry") == "retrying"
        assert old.fail(p, fatal, "fatal") == "dead"
        retried.add(again.run_id)
        dead.add(fatal.run_id)
        held[p] = rest
    states = Counter(app.get_run(i).state for group in ids.values() for i in group)
    assert set(states) == {"scheduled", "running", "retrying", "dead", "succeeded"}, states
    old_done = [i for i in succeeded]
    assert all(len(r.lrange(k.attempts(k.partition_of_run(i), i), 0, -1)) == 1 for i in old_done)

    # the upgrade: the first process of this version marks the namespace format 2 (the last
    # format the previous release's workers serve beside it; duetime migrate goes on to 3)
    app.store._ready = False
    app.store.ready()
    assert r.hget(k.meta, "format") == b"2"
    assert all(r.hget(k.caps(p), "format") is None for p in range(k.partitions))
    for i in old_done:  # a run finished by the old layout reads as before: one attempt, once
        [a] = app.get_run(i).attempts
        assert a.outcome == "succeeded" and a.fence == 1
    assert [a.outcome for a in app.get_run(next(iter(dead))).attempts] == ["failed"]

    # side by side under load: each round a producer of each version adds runs, the old
    # worker first finishes what it held, then both claim and complete in turn
    produced = [i for g in ids.values() for i in g]
    for rnd in range(6):
        produced += app.enqueue_many([(basic.noop, []) for _ in range(2 * k.partitions)])
        for _ in range(k.partitions):
            extra = os.urandom(10).hex()
            assert old.enqueue(k.partition_of_run(extra), [extra]) == 1
            produced.append(extra)
        for p in ids:
            for worker in (old, new) if rnd % 2 else (new, old):
                claimed = worker.claim(p, 3)
                claims.update(c.run_id for c in claimed)
                runs = (held.pop(p, []) if worker is old else []) + claimed
                if runs:
                    for c, res in zip(runs, worker.complete(p, runs), strict=True):
                        assert res == "succeeded", (c.run_id, res)
                        succeeded[c.run_id] += 1
    for p in ids:  # drain what is left, alternating versions
        while True:
            got = 0
            for worker in (new, old):
                runs = worker.claim(p, 50)
                claims.update(c.run_id for c in runs)
                if runs:
                    got += len(runs)
                    for c, res in zip(runs, worker.complete(p, runs), strict=True):
                        assert res == "succeeded"
                        succeeded[c.run_id] += 1
            if not got:
                break

    everyone = set(produced)
    _each_run_once(app, everyone, dead, retried, succeeded, claims)
    # the new layout is in use: a first-try success by this version wrote no attempts key
    new_firsts = [i for i in everyone - dead - retried - set(old_done)
                  if r.exists(k.attempts(k.partition_of_run(i), i)) == 0]
    assert new_firsts
    # a report sent again across versions gets the first answer and changes nothing
    one = new_firsts[0]
    p1 = k.partition_of_run(one)
    again = [SimpleNamespace(run_id=one, fence=1)]
    assert old.complete(p1, again) == ["succeeded"] and new.complete(p1, again) == ["succeeded"]
    assert [a.outcome for a in app.get_run(one).attempts] == ["succeeded"]

    # the retention sweep deletes finished runs of both layouts with their attempts
    lc_scripts = Scripts(r)

    def swept() -> bool:
        for p in range(k.partitions):
            keys, args = tr.reap(k, p, 1000, 0.3, 1)
            lc_scripts.reap(keys=keys, args=args)
        return all(r.exists(k.run(k.partition_of_run(i), i), k.attempts(k.partition_of_run(i), i))
                   == 0 for i in everyone - dead)

    wait_for(swept, 30, what="the retention sweep of both layouts")  # keeps the last 1 ms


def test_a_namespace_of_a_newer_format_is_refused_with_one_clear_error(app, r):
    r.hset(app.keys.meta, mapping={"partitions": app.keys.partitions, "version": "1",
                                   "format": str(FORMAT + 1)})
    app.store._ready = False
    with pytest.raises(FormatTooNew, match=rf"layout format {FORMAT + 1} .*reads formats 1\.\.{FORMAT}"):
        app.store.ready()


# -- format 2 to 3 --------------------------------------------------------------------------
def _format2(app, r) -> Version:
    """The format-2 release's transitions: its scripts take the arguments this version's
    take and reply alike (only what they write differs)."""
    memory = app.redis_url.startswith("memory:")
    old = {n: r.register_script(_old_source(n, memory, OLD2))
           for n in ("enqueue", "claim", "complete", "fail")}
    return Version(r, app.keys, old, False, "old-worker")


def _record(r, k, run_id: str) -> dict[bytes, bytes]:
    return r.hgetall(k.run(k.partition_of_run(run_id), run_id))


class _Fleet:
    """An older release's fleet at work on its namespace: `per_partition` runs enqueued in
    every partition, and in each one finished, one retrying, one dead and one running (its
    lease held: `held`); the tallies the checks at the end read (`_each_run_once`)."""

    def __init__(self, old: Version, k, per_partition: int) -> None:
        self.ids: dict[int, list[str]] = {}
        for n in range(per_partition * k.partitions):
            rid = f"{n:020x}"
            self.ids.setdefault(k.partition_of_run(rid), []).append(rid)
        for p, group in self.ids.items():
            assert old.enqueue(p, group) == len(group)
        self.claims: Counter[str] = Counter()
        self.succeeded: Counter[str] = Counter()
        self.retried: set[str] = set()
        self.dead: set[str] = set()
        self.held: dict[int, list] = {}
        for p in self.ids:
            done, again, fatal, running = old.claim(p, 4)
            self.claims.update(c.run_id for c in (done, again, fatal, running))
            self.finish(old, p, [done])
            assert old.fail(p, again, "retry") == "retrying"
            assert old.fail(p, fatal, "fatal") == "dead"
            self.retried.add(again.run_id)
            self.dead.add(fatal.run_id)
            self.held[p] = [running]

    def finish(self, worker: Version, p: int, runs: list) -> None:
        if runs:
            assert worker.complete(p, runs) == ["succeeded"] * len(runs)
            self.succeeded.update(c.run_id for c in runs)


def _serve(workers: list[Version], k, claims: Counter, succeeded: Counter, rounds: int) -> None:
    """Each version in turn claims and completes a few runs of every partition."""
    for rnd in range(rounds):
        for p in range(k.partitions):
            for worker in workers if rnd % 2 else workers[::-1]:
                runs = worker.claim(p, 3)
                claims.update(c.run_id for c in runs)
                if runs:
                    for c, res in zip(runs, worker.complete(p, runs), strict=True):
                        assert res == "succeeded", (c.run_id, res)
                        succeeded[c.run_id] += 1


def test_a_format_2_namespace_is_served_side_by_side_then_migrated(
        app, r, namespace, monkeypatch):
    from duetime.common import connection

    from duetime.ops import migrate as mig

    k = app.keys
    old = _format2(app, r)
    new = Version(r, k, {n: getattr(Scripts(r), n) for n in old.s}, False, "new-worker")
    # the format-2 release's first use of the namespace
    r.hset(k.meta, mapping={"partitions": k.partitions, "version": "1", "created_ms": 1,
                            "format": "2"})
    fleet = _Fleet(old, k, 6)
    ids, claims, succeeded, finish = fleet.ids, fleet.claims, fleet.succeeded, fleet.finish
    retried, dead, held = fleet.retried, fleet.dead, fleet.held

    # this version's first process: the namespace stays format 2, and so do its writes
    app.store._ready = False
    app.store.ready()
    assert r.hget(k.meta, "format") == b"2"
    produced = [i for g in ids.values() for i in g]
    side = app.enqueue_many([(basic.noop, []) for _ in range(2 * k.partitions)])
    produced += side
    assert all(b"created" in _record(r, k, i) and b"backoff_base" in _record(r, k, i)
               for i in side), "a format-2 namespace gets format-2 records from this version"
    # a run this version made, failed by the older worker: retried on its record's back-off
    p0 = k.partition_of_run(side[0])
    mine = old.claim(p0, 100)
    claims.update(c.run_id for c in mine)
    [c0] = [c for c in mine if c.run_id == side[0]]
    assert old.fail(p0, c0, "error") == "retrying"
    retried.add(c0.run_id)
    finish(old, p0, [c for c in mine if c is not c0])
    for p, runs in held.items():  # the older worker finishes what it held
        finish(old, p, runs)
    extra = [os.urandom(10).hex() for _ in range(k.partitions)]
    for rid in extra:
        assert old.enqueue(k.partition_of_run(rid), [rid]) == 1
    produced += extra
    for p in range(k.partitions):  # both versions serve what is due, in turn
        for worker in (new, old) if p % 2 else (old, new):
            runs = worker.claim(p, 3)
            claims.update(c.run_id for c in runs)
            finish(worker, p, runs)

    # the migration: refused while a worker of the older release is live (its record says
    # nothing of formats), naming it; a dry run writes nothing; done once it is gone
    r.zadd(k.workers, {"old-host:1:ab": 1})
    r.hset(k.worker("old-host:1:ab"), mapping={"queues": "default", "host": "old-host",
                                               "pid": 1, "concurrency": 4})
    plan = mig.plan(r, k, app.redis_url)
    assert plan.current == 2 and plan.target == FORMAT
    assert [w.id for w in plan.blockers] == ["old-host:1:ab"]
    out = cli(app.redis_url, namespace, "migrate")
    assert out.exit_code == 1 and "old-host:1:ab" in out.stderr, out.stderr
    out = cli(app.redis_url, namespace, "migrate", "--dry-run", "--force")
    assert out.exit_code == 0 and "would move" in out.stdout, out.stderr
    assert r.hget(k.meta, "format") == b"2"
    assert all(r.hget(k.caps(p), "format") is None for p in range(k.partitions))
    r.delete(k.worker("old-host:1:ab"))  # the older worker stopped: its record expired
    out = cli(app.redis_url, namespace, "migrate")
    assert out.exit_code == 0 and f"from format 2 to {FORMAT}" in out.stdout, out.stderr
    assert r.hget(k.meta, "format") == str(FORMAT).encode()
    assert all(r.hget(k.caps(p), "format") == str(FORMAT).encode() for p in range(k.partitions))
    # a process of the older release (it reads up to format 2) is refused at its start
    monkeypatch.setattr(connection, "FORMAT", 2)
    with pytest.raises(FormatTooNew, match="reads formats 1..2"):
        connection.check_format(r.hget(k.meta, "format"), k)
    monkeypatch.undo()

    # format 3 on: what this version writes now leaves the defaults out, and reads as before
    compact = app.enqueue_many([(basic.noop, []) for _ in range(2 * k.partitions)])
    produced += compact
    rec = _record(r, k, compact[0])
    assert set(rec) == {b"state", b"due", b"task", b"payload"}, rec
    assert app.get_run(compact[0]).max_attempts == 4
    assert app.get_run(compact[0]).created == app.get_run(compact[0]).due
    assert app.get_run(compact[0]).queue == "default"
    # a compact run that fails is retried with the default back-off (1 s base, equal jitter:
    # 0.5 to 1 s)
    p1 = k.partition_of_run(compact[1])
    mine = new.claim(p1, 100)
    claims.update(c.run_id for c in mine)
    [c1] = [c for c in mine if c.run_id == compact[1]]
    sec, usec = r.time()
    before = sec * 1000 + usec // 1000
    assert new.fail(p1, c1, "error") == "retrying"
    retried.add(c1.run_id)
    sec, usec = r.time()
    after = sec * 1000 + usec // 1000
    retry_at = int(_record(r, k, c1.run_id)[b"retry_at"])
    assert before + 500 <= retry_at <= after + 1000, (before, retry_at, after)
    finish(new, p1, [c for c in mine if c is not c1])
    for c in (c0, c1):  # their retries due now, not in a second
        r.zadd(k.retry(k.partition_of_run(c.run_id), "default"), {c.run_id: 0})
    for p in range(k.partitions):  # drain
        while runs := new.claim(p, 100):
            claims.update(c.run_id for c in runs)
            finish(new, p, runs)

    _each_run_once(app, set(produced), dead, retried, succeeded, claims)


# -- format 3 to 4 --------------------------------------------------------------------------
OLD3 = Path(__file__).resolve().parent.parent / "fixtures" / "format3.tar.gz"


class _Format3(Version):
    """The format-3 release's worker: its scripts, and its reading of a claim reply, which
    took every due time as a whole ms (`int()`: a fraction raised, and the batch was lost)."""

    def claim(self, p: int, n: int) -> list:
        keys, args = tr.claim(self.k, p, "default", self.worker, n, 60_000)
        res = self.s["claim"](keys=keys, args=args)
        for i in range(tr.CLAIM_HEADER, len(res), tr.CLAIM_FIELDS):
            ready, due = res[i].split(b" ")[2], res[i + 3]
            int(ready), int(due)  # as that release read them: raises on a fraction
        return tr.parse_claim(res).runs


def _instants(r, n: int) -> list[datetime]:
    """n instants just past (due at once), a ms apart, each 457 µs into its ms (never a whole
    ms: that one would be stored as an integer in any format)."""
    sec, usec = r.time()
    base = datetime.fromtimestamp(sec, UTC) + timedelta(milliseconds=usec // 1000 - 2000)
    return [base + timedelta(microseconds=1000 * j + 457) for j in range(n)]


def _at(instants: list[datetime]) -> list[dict]:
    return [{"task": basic.noop, "args": [], "at": t} for t in instants]


def test_a_format_3_namespace_is_served_side_by_side_then_migrated_to_microsecond_due_times(
        app, r, namespace, monkeypatch):
    from duetime.common import connection

    from duetime.ops import migrate as mig

    k = app.keys
    memory = app.redis_url.startswith("memory:")
    old = _Format3(r, k, {n: r.register_script(_old_source(n, memory, OLD3))
                          for n in ("enqueue", "claim", "complete", "fail")}, False, "old-worker")
    new = Version(r, k, {n: getattr(Scripts(r), n) for n in old.s}, False, "new-worker")
    # the format-3 release's first use of the namespace: its meta and every partition say 3
    r.hset(k.meta, mapping={"partitions": k.partitions, "version": "1", "created_ms": 1,
                            "format": "3"})
    connection.mark_partitions_format(r, k, 3)
    fleet = _Fleet(old, k, 5)
    ids, claims, succeeded, finish = fleet.ids, fleet.claims, fleet.succeeded, fleet.finish
    retried, dead, held = fleet.retried, fleet.dead, fleet.held

    # this version's first process: the namespace stays format 3, and so do its writes: an
    # instant asked for to the microsecond is stored as the next whole ms, which the older
    # worker reads
    app.store._ready = False
    app.store.ready()
    assert r.hget(k.meta, "format") == b"3"
    whole = _instants(r, 2 * k.partitions)
    side = app.enqueue_many(_at(whole))
    for rid, t in zip(side, whole, strict=True):
        rec = _record(r, k, rid)
        ceil_ms = to_ms(t, ceil=True)
        assert rec[b"due"] == str(ceil_ms).encode(), (rec[b"due"], t)
        assert r.zscore(k.due(k.partition_of_run(rid), "default"), rid) == ceil_ms
        assert app.get_run(rid).due == from_ms(ceil_ms)
    for p, runs in held.items():  # the older worker finishes what it held
        finish(old, p, runs)
    for p in range(k.partitions):  # both versions serve what is due, in turn
        for worker in (new, old) if p % 2 else (old, new):
            runs = worker.claim(p, 3)
            claims.update(c.run_id for c in runs)
            finish(worker, p, runs)
    produced = [i for g in ids.values() for i in g] + side

    # the migration: refused while a worker of the format-3 release is live (its record says it
    # reads up to format 3), naming it; done once it is gone
    r.zadd(k.workers, {"old-host:1:ab": 1})
    r.hset(k.worker("old-host:1:ab"), mapping={"queues": "default", "host": "old-host",
                                               "pid": 1, "concurrency": 4, "formats": 3})
    plan = mig.plan(r, k, app.redis_url)
    assert plan.current == 3 and plan.target == FORMAT == 4
    assert [w.id for w in plan.blockers] == ["old-host:1:ab"]
    out = cli(app.redis_url, namespace, "migrate")
    assert out.exit_code == 1 and "old-host:1:ab" in out.stderr, out.stderr
    assert r.hget(k.meta, "format") == b"3"
    r.delete(k.worker("old-host:1:ab"))
    out = cli(app.redis_url, namespace, "migrate")
    assert out.exit_code == 0 and "from format 3 to 4" in out.stdout, out.stderr
    assert all(r.hget(k.caps(p), "format") == b"4" for p in range(k.partitions))
    # a process of the format-3 release is refused at its start
    monkeypatch.setattr(connection, "FORMAT", 3)
    with pytest.raises(FormatTooNew, match="reads formats 1..3"):
        connection.check_format(r.hget(k.meta, "format"), k)
    monkeypatch.undo()

    # format 4: the instant asked for is the due time, to the microsecond, in the record, in
    # the due set and in the claim, which never hands the run out before it
    fine = _instants(r, 2 * k.partitions)
    mine = app.enqueue_many(_at(fine))
    produced += mine
    for rid, t in zip(mine, fine, strict=True):
        rec, p = _record(r, k, rid), k.partition_of_run(rid)
        assert b"." in rec[b"due"], rec[b"due"]
        assert app.get_run(rid).due == t
        score = r.zscore(k.due(p, "default"), rid)
        assert score * 1000 >= to_us(t) and score != to_ms(t, ceil=True), (score, t)
    for p in range(k.partitions):  # drain with this version: each claim reads the instant
        while runs := new.claim(p, 100):
            claims.update(c.run_id for c in runs)
            for c in runs:
                if c.run_id in mine:
                    t = fine[mine.index(c.run_id)]
                    assert isinstance(c.ready_ms, float) and c.ready_ms * 1000 >= to_us(t)
                    assert from_ms(c.ready_ms) == t and from_ms(c.due_ms) == t
            finish(new, p, runs)
    for rid, t in zip(mine, fine, strict=True):  # the attempt's start: a whole ms, not before
        started = app.get_run(rid).attempts[-1].started
        assert started is not None and started >= t, (started, t)

    _each_run_once(app, set(produced), dead, retried, succeeded, claims)
