"""Dependencies across partitions and a batch on the 3+3 cluster (three primaries, each with
a replica): the dependent's partition is on another shard than its dependency's, so its
release goes through the dependency's notice list and the relay (the reaper)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from duetime.client.runs import EnqueueRequest
from duetime.embedded import EmbeddedCluster
from tests.apps import workloads as w
from tests.conftest import configured, wait_for
from tests.integration.inproc import burst, reaper_thread
from tests.recorder import Recorder

pytestmark = [pytest.mark.scripts, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster("redis", replicas=1) as c:
        yield c


@pytest.fixture
def capp(cluster: EmbeddedCluster):
    with configured(w.app, cluster.url, "c") as a:
        yield a


def _on_other_shards(app, cluster: EmbeddedCluster) -> tuple[str, str, str]:
    """Three run ids whose partitions are on three different primaries."""
    client = w.r()
    ids: dict[str, str] = {}
    nodes = client.get_nodes()
    primaries = [n for n in nodes if n.server_type == "primary"]
    assert len(primaries) == 3
    i = 0
    while len(ids) < 3:
        rid = f"x{i}"
        i += 1
        key = app.keys.run(app.keys.partition_of_run(rid), rid)
        node = client.get_node_from_key(key)
        ids.setdefault(node.name, rid)
    return tuple(ids.values())  # type: ignore[return-value]


class _Timed(Recorder):
    """The reaper's log lines, each with the monotonic time it was logged at."""

    def _add(self, level: str, event: str, **kw: Any) -> None:
        super()._add(level, event, t=round(time.monotonic(), 2), **kw)


def _explain(app, reaper, rec: _Timed, runs: dict[str, str], passes: list[Any]) -> str:
    """Where a cross-shard release stands: each run's state, every non-empty dependency list,
    the reaper thread and its relay's per-node state, its relay passes and its log."""
    k, r = app.keys, w.r()
    out = []
    for name, rid in runs.items():
        p = k.partition_of_run(rid)
        try:
            run = app.get_run(rid)
            out.append(f"{name}={rid} partition {p} on {r.get_node_from_key(k.run(p, rid)).name}: "
                       f"{run.state} ({run.reason})")
        except Exception as exc:  # noqa: BLE001 - a diagnosis: say what it could not read
            out.append(f"{name}={rid}: unreadable ({exc!r})")
        try:
            out.append(f"  dependents of {name}: {sorted(r.smembers(k.dependents(p, rid)))}")
        except Exception as exc:  # noqa: BLE001
            out.append(f"  dependents of {name}: unreadable ({exc!r})")
    for p in range(k.partitions):
        try:
            notes, links = r.lrange(k.depnotes(p), 0, -1), r.lrange(k.deplinks(p), 0, -1)
        except Exception as exc:  # noqa: BLE001
            out.append(f"partition {p}: lists unreadable ({exc!r})")
            continue
        if notes or links:
            out.append(f"partition {p}: depnotes {notes} deplinks {links}")
    thread = getattr(reaper, "thread", None)
    out.append(f"reaper thread alive: {thread is not None and thread.is_alive()}, "
               f"error: {getattr(reaper, 'thread_error', None)!r}")
    for name in ("relays", "shards"):
        sh = getattr(reaper, name)
        out.append(f"reaper.{name}: held {sh.held} (now {time.monotonic():.2f}), errors "
                   f"{ {n: repr(e) for n, e in sh.errors.items()} }, out "
                   f"{ {n: f.done() for n, f in sh._out.items()} }")
    out.append(f"relay passes: {len(passes)}, the last: {passes[-3:]}")
    out.append("reaper log:")
    out.extend(f"  {level} {event} {kw}" for level, event, kw in rec.lines[-40:])
    return "\n".join(out)


def _explained(pred: Callable[[], object], what: str, explain: Callable[[], str]) -> None:
    try:
        wait_for(pred, 90, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{explain()}") from None


def test_a_dependency_on_another_shard_releases_its_dependent(capp, cluster, monkeypatch):
    """a, b, c on three primaries, c waiting on b waiting on a. The hand-over across shards
    goes through the relay, so it is observed in steps, with no worker running while a
    release is waited for: a worker serving beside the relay runs b as soon as it is released
    (as it should), and a test waiting for b to be `scheduled` then waits for a state b has
    already left (the CI failures of this test: the first burst, still checking it was idle,
    was woken by b's release and ran it; b died and the relay cancelled c, all within a
    second, while the test waited 90 s for `scheduled`)."""
    from duetime.scheduler import notices
    from duetime.scheduler import reaper as reaper_mod

    rec = _Timed()
    monkeypatch.setattr(reaper_mod, "log", rec)
    monkeypatch.setattr(notices, "log", rec)
    a, b, c = _on_other_shards(capp, cluster)
    k, spec, store = capp.keys, capp.registry.resolve(w.step), capp.store
    store.enqueue_many([EnqueueRequest(spec, [1], run_id=a)])
    store.enqueue_many([EnqueueRequest(spec, [2, True], run_id=b, depends_on=(a,))])
    store.enqueue_many([EnqueueRequest(spec, [3], run_id=c, depends_on=(b,))])
    assert capp.get_run(b).state == "waiting" and capp.get_run(c).state == "waiting"
    pa, pb = k.partition_of_run(a), k.partition_of_run(b)
    assert burst(capp).processed == 1  # a succeeds; b's shard learns it only through the relay
    assert capp.get_run(a).state == "succeeded" and capp.get_run(b).state == "waiting"
    assert w.r().lrange(k.depnotes(pa), 0, -1) == [f"{pb}|{b}|{a}|succeeded".encode()]
    with reaper_thread(capp) as reaper:
        passes: list[Any] = []
        relay = reaper.relay_once

        def counted() -> int:
            try:
                n = relay()
            except BaseException as exc:
                passes.append((round(time.monotonic(), 2), repr(exc)))
                raise
            passes.append((round(time.monotonic(), 2), n))
            return n

        reaper.relay_once = counted  # type: ignore[method-assign]
        runs = {"a": a, "b": b, "c": c}

        def explain() -> str:
            return _explain(capp, reaper, rec, runs, passes)

        # the reaper's relay carries the notice across shards: a deadline for a busy machine
        _explained(lambda: capp.get_run(b).state == "scheduled", "b released by the relay",
                   explain)
        # applied, then removed: the removal is the pass's next call, on a's shard, so it may
        # still be on its way when b is seen released
        _explained(lambda: w.r().llen(k.depnotes(pa)) == 0, "the applied notice removed",
                   explain)
        assert burst(capp).processed == 1  # b dies: c, on a third shard, is cancelled naming it
        _explained(lambda: capp.get_run(c).state == "cancelled", "c cancelled by the relay",
                   explain)
    assert capp.get_run(b).state == "dead"
    assert capp.get_run(c).reason == f"dependency {b} ended dead"


def test_a_dependency_that_ended_before_the_link_counts_at_once(capp, cluster):
    a, b, _ = _on_other_shards(capp, cluster)
    spec = capp.registry.resolve(w.step)
    capp.store.enqueue_many([EnqueueRequest(spec, [1], run_id=a)])
    burst(capp)
    capp.store.enqueue_many([EnqueueRequest(spec, [2], run_id=b, depends_on=(a,))])
    assert capp.get_run(b).state == "scheduled"  # the producer linked and applied it


def test_a_batch_and_its_callbacks_on_the_cluster(capp):
    bid = capp.batch([(w.member, [i, i == 3]) for i in range(20)],
                     on_complete=(w.callback, ["complete"]), on_failure=(w.callback, ["failure"]))
    burst(capp)
    b = capp.wait_batch(bid, timeout=30)
    assert (b.succeeded, b.failed) == (19, 1)
    burst(capp)
    for rid in (b.on_complete_run, b.on_failure_run):
        assert capp.get_run(rid).state == "succeeded"
        assert int(w.r().hget(w.ran_key(), rid) or 0) == 1
