"""Dependencies across partitions and a batch on the 3+3 cluster (three primaries, each with
a replica): the dependent's partition is on another shard than its dependency's, so its
release goes through the dependency's notice list and the relay (the reaper)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from duetime.client.runs import EnqueueRequest
from duetime.embedded import EmbeddedCluster
from tests.apps import workloads as w
from tests.conftest import configured, wait_for
from tests.integration.inproc import burst, reaper_thread

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


@pytest.mark.skipif(os.environ.get("DUETIME_SOAK") != "1", reason=(
    "soak only (make soak): in 3 of 4 clean-clone CI runs of the full suite the per-node relay "
    "did not release the cross-shard dependent within 90 s, while the test passes alone and "
    "under CPU load; an open defect, not a passing test (docs/testing.md)"))
def test_a_dependency_on_another_shard_releases_its_dependent(capp, cluster):
    a, b, c = _on_other_shards(capp, cluster)
    spec = capp.registry.resolve(w.step)
    store = capp.store
    store.enqueue_many([EnqueueRequest(spec, [1], run_id=a)])
    store.enqueue_many([EnqueueRequest(spec, [2, True], run_id=b, depends_on=(a,))])
    store.enqueue_many([EnqueueRequest(spec, [3], run_id=c, depends_on=(b,))])
    assert capp.get_run(b).state == "waiting" and capp.get_run(c).state == "waiting"
    with reaper_thread(capp):
        burst(capp)
        # the reaper's relay carries the notice across shards: a deadline for a busy machine
        wait_for(lambda: capp.get_run(b).state == "scheduled", 90, what="b released by the relay")
        burst(capp)  # b dies: c, on a third shard, is cancelled naming it
        wait_for(lambda: capp.get_run(c).state == "cancelled", 90, what="c cancelled by the relay")
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
