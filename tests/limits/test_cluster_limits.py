"""Limits on Redis Cluster and Valkey cluster: a tenant's runs, its limit and its running
slots share one partition (one slot), so the claim counts them atomically on any shard."""

from __future__ import annotations

from duetime.common.connection import sync_client

from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.test_cluster import capp, cluster, cprocs  # noqa: F401 - fixtures
from tests.limits.journal import entries, max_running


def test_tenant_concurrency_limit_on_a_cluster(capp, cprocs):  # noqa: F811
    capp.set_limit("tenant", "acme", concurrency=3)
    capp.set_limit("task", "limited", rate=1000)  # a rate bucket in the same slot, too
    ids = capp.enqueue_many([(basic.limited, [0.1]) for _ in range(24)])
    cprocs.worker("--concurrency", "5")
    cprocs.worker("--concurrency", "5")
    r = sync_client(capp.redis_url)
    wait_for(lambda: len(entries(r)) >= 48, 60, what="24 runs to start and end")
    assert max_running(r) == 3
    wait_for(lambda: all(capp.get_run(i).state == "succeeded" for i in ids), 20,
             what="every run to succeed")
