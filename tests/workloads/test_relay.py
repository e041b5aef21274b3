"""The dependency relay's passes (scheduler/relay.py): the notices of a pass applied with one
deps_apply.lua call per target partition and removed with one deps_done.lua call per
partition read; a partition read again only when its list may hold more or an entry was not
applied; a refused call or a relay that dies before removing loses no notice."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts
from duetime.scheduler import relay
from duetime.scheduler.relay import relay_once, relay_pass

from duetime.client.runs import EnqueueRequest
from tests.apps import workloads as w

pytestmark = pytest.mark.scripts


def _id_in(app: Any, p: int, tag: str) -> str:
    return next(f"{tag}{i}" for i in range(100_000) if app.keys.partition_of_run(f"{tag}{i}") == p)


def _waiting_on(app: Any, pairs: list[tuple[int, int]], tag: str) -> list[tuple[str, str]]:
    """Per (dependency's partition, dependent's partition): a dependency due in an hour and a
    run waiting on it; → (dependency, dependent) ids."""
    spec = app.registry.resolve(w.step)
    out = []
    for i, (pa, pb) in enumerate(pairs):
        a, b = _id_in(app, pa, f"{tag}a{i}x"), _id_in(app, pb, f"{tag}b{i}x")
        app.store.enqueue_many([EnqueueRequest(spec, [i], run_id=a, delay=3600)])
        app.store.enqueue_many([EnqueueRequest(spec, [i], run_id=b, depends_on=(a,))])
        out.append((a, b))
    return out


def _end(app: Any, pairs: list[tuple[str, str]]) -> None:
    """Cancel the dependencies: each leaves a notice for its dependent in its own partition."""
    for a, _ in pairs:
        app.cancel(a)


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.scripts(memory="the in-memory server keeps no commandstats to count calls by")
def test_a_pass_calls_one_script_per_target_partition_and_one_removal_per_list(wapp, r):
    """Eight notices read from two partitions (6 from A for B and C, 2 from D for B): one
    deps_apply for B and one for C, one deps_done for A and one for D; before, a script call
    and an LREM per notice."""
    A, B, C, D = 1, 2, 3, 4
    pairs = _waiting_on(wapp, [(A, B), (A, C)] * 3 + [(D, B)] * 2, "batch")
    _end(wapp, pairs)
    k = wapp.keys
    assert r.llen(k.depnotes(A)) == 6 and r.llen(k.depnotes(D)) == 2
    evalsha, lrem, ltrim = _calls(r, "evalsha"), _calls(r, "lrem"), _calls(r, "ltrim")
    assert relay_once(wapp.store.client, k, Scripts(wapp.store.client), [A, D]) == 8
    assert _calls(r, "evalsha") - evalsha == 4
    # A's six trimmed from the head at once; D's two removed by value (each found at the head)
    assert (_calls(r, "ltrim") - ltrim, _calls(r, "lrem") - lrem) == (1, 2)
    assert {wapp.get_run(b).state for _, b in pairs} == {"cancelled"}
    assert r.llen(k.depnotes(A)) == 0 and r.llen(k.depnotes(D)) == 0


@pytest.mark.scripts(memory="the in-memory server keeps no commandstats to count list reads by")
def test_the_reaper_reads_again_only_a_list_that_may_hold_more(wapp, url, r, monkeypatch):
    """Told of a partition with a notice and one without, a pass that applies the notice
    leaves neither to be read again (before: every partition it was told of); a list read
    full is read again next pass, and its rest applied then."""
    from duetime.scheduler.reaper import Reaper

    A, B, E = 1, 2, 5
    k = wapp.keys
    reaper = Reaper(url, k)
    try:
        assert reaper.relay_once() == 0  # its first pass is a safety read of every partition
        pairs = _waiting_on(wapp, [(A, B)], "short")
        _end(wapp, pairs)
        reaper.told_relay(A)
        reaper.told_relay(E)
        assert reaper.relay_once() == 1
        lrange = _calls(r, "lrange")
        assert reaper.relay_once() == 0
        assert _calls(r, "lrange") == lrange  # nothing told, nothing read again

        monkeypatch.setattr(relay, "RELAY_BATCH", 2)
        pairs = _waiting_on(wapp, [(A, B)] * 3, "full")
        _end(wapp, pairs)
        reaper.told_relay(A)
        assert reaper.relay_once() == 2  # a full list: A is read again
        assert reaper.relay_once() == 1
        assert reaper.relay_once() == 0
        assert {wapp.get_run(b).state for _, b in pairs} == {"cancelled"}
    finally:
        reaper.close()


def test_a_refused_apply_leaves_its_notices_and_the_rest_of_the_pass_goes_on(wapp, r):
    """A target partition whose events stream is damaged refuses its deps_apply: its notices
    stay in the list they were read from, which is read again; the notices for the other
    partition are applied and removed. Repaired, the next pass applies the rest."""
    A, B, C = 1, 2, 3
    k = wapp.keys
    pairs = _waiting_on(wapp, [(A, C), (A, B), (A, C), (A, B)], "refused")
    _end(wapp, pairs)
    r.delete(k.events(C))
    r.set(k.events(C), "not a stream")
    s = Scripts(wapp.store.client)
    out = relay_pass(wapp.store.client, k, s, [A])
    assert out.applied == 2 and out.again == {A} and out.refused
    assert "DAMAGED" in out.refused[0]
    assert [wapp.get_run(b).state for _, b in pairs] == ["waiting", "cancelled"] * 2
    notes = [x.decode() for x in r.lrange(k.depnotes(A), 0, -1)]
    assert [n.split("|")[1] for n in notes] == [pairs[0][1], pairs[2][1]]
    r.delete(k.events(C))
    assert relay_once(wapp.store.client, k, s, [A]) == 2
    assert {wapp.get_run(b).state for _, b in pairs} == {"cancelled"}
    assert r.llen(k.depnotes(A)) == 0


class _DiesBeforeRemoving(Scripts):
    """The relay's process dies after its notices were applied, before they are removed."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)

        def die(**_: Any) -> None:
            raise KeyboardInterrupt

        self.deps_done = die  # type: ignore[assignment]


def test_a_relay_that_dies_before_removing_leaves_its_notices_to_be_read_again(wapp, r):
    A, B, C = 1, 2, 3
    k = wapp.keys
    pairs = _waiting_on(wapp, [(A, B), (A, C)], "dies")
    _end(wapp, pairs)
    with pytest.raises(KeyboardInterrupt):
        relay_once(wapp.store.client, k, _DiesBeforeRemoving(wapp.store.client), [A])
    assert {wapp.get_run(b).state for _, b in pairs} == {"cancelled"}  # applied
    assert r.llen(k.depnotes(A)) == 2  # not removed: read again
    reason = [wapp.get_run(b).reason for _, b in pairs]
    assert relay_once(wapp.store.client, k, Scripts(wapp.store.client), [A]) == 2
    assert r.llen(k.depnotes(A)) == 0
    assert [wapp.get_run(b).reason for _, b in pairs] == reason  # applied twice: counted once


def test_deps_done_removes_what_was_read_and_keeps_what_was_not(wapp, r):
    """deps_done.lua: the head as read is trimmed at once; when another relay removed some
    of it meanwhile, or an entry was left out, each given is removed once by value and the
    others (appended since, or left out) stay."""
    k, s, p = wapp.keys, Scripts(wapp.store.client), 6
    notes, links = k.depnotes(p), k.deplinks(p)

    def done(ns: list[str], ls: list[str]) -> int:
        keys, args = tr.deps_done(k, p, [x.encode() for x in ns], [x.encode() for x in ls])
        return int(s.deps_done(keys=keys, args=args))

    def left(key: str) -> list[str]:
        return [x.decode() for x in r.lrange(key, 0, -1)]

    r.rpush(notes, "n1", "n2", "n3", "n4")
    r.rpush(links, "l1", "l2")
    assert done(["n1", "n2", "n3"], ["l1"]) == 4
    assert left(notes) == ["n4"] and left(links) == ["l2"]
    r.delete(notes, links)
    r.rpush(notes, "n1", "n2", "n3", "n4")
    r.lrem(notes, 1, "n2")  # another relay removed it
    r.rpush(notes, "n5")  # appended since the read
    assert done(["n1", "n2", "n3"], []) == 2
    assert left(notes) == ["n4", "n5"]
    r.delete(notes)
    r.rpush(notes, "n1", "n2", "n3", "n4")
    assert done(["n1", "n3", "n4"], []) == 3  # n2 not applied: left out, kept
    assert left(notes) == ["n2"]
    assert done([], []) == 0 and left(notes) == ["n2"]
