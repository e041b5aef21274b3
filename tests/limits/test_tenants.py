"""Tenants: a run says who it is for; it lives in its tenant's partition (so the tenant's
limits are counted in one slot), and shows its tenant wherever runs are read."""

from __future__ import annotations

from datetime import timedelta

import pytest

import duetime
from tests.apps import basic
from tests.integration.opkit import as_json, cli, ok


def test_enqueue_with_a_tenant_pins_the_run_to_the_tenants_partition(app):
    k = app.keys
    home = k.partition_of_tenant("acme")
    ids = [app.enqueue(basic.noop, [i], tenant="acme") for i in range(20)]
    assert {k.partition_of_run(i) for i in ids} == {home}
    run = app.get_run(ids[0])
    assert run.tenant == "acme" and run.state == "scheduled"
    # an idempotency key finds the same pinned run again
    a = app.enqueue(basic.noop, key="order-1", tenant="acme")
    assert app.enqueue(basic.noop, key="order-1", tenant="acme") == a
    assert k.partition_of_run(a) == home
    # without a tenant: no field, the usual partition
    plain = app.get_run(app.enqueue(basic.noop))
    assert plain.tenant is None


def test_task_default_tenant_and_override(app):
    run = app.get_run(app.enqueue(basic.limited, [0]))
    assert run.tenant == "acme"
    other = app.get_run(app.enqueue(basic.limited, [0], tenant="globex"))
    assert other.tenant == "globex"
    assert app.keys.partition_of_run(other.id) == app.keys.partition_of_tenant("globex")
    [many] = app.enqueue_many([{"task": basic.noop, "tenant": "initech"}])
    assert app.get_run(many).tenant == "initech"


@pytest.mark.parametrize("bad", ["", "a{b}", "a|b", "a b", "x" * 201])
def test_bad_tenant_names_are_refused_before_anything_is_written(app, bad):
    with pytest.raises(duetime.InvalidInput):
        app.enqueue(basic.noop, tenant=bad)
    with pytest.raises(duetime.InvalidInput):
        app.task(name="t-bad", tenant=bad)(lambda: None)
    with pytest.raises(duetime.InvalidInput):
        app.schedule("s-bad", duetime.Every(timedelta(minutes=1)), basic.noop, tenant=bad)


def test_scheduled_runs_inherit_the_schedules_tenant(app):
    app.schedule("nightly", duetime.Every(timedelta(hours=1)), basic.noop, tenant="acme")
    run = app.get_run(app.trigger("nightly"))
    assert run.tenant == "acme" and app.get_schedule("nightly").tenant == "acme"
    # a schedule of a task with a default tenant inherits it; removing the override clears it
    app.schedule("j", duetime.Every(timedelta(hours=1)), basic.limited, [0])
    assert app.get_run(app.trigger("j")).tenant == "acme"
    app.schedule("nightly", duetime.Every(timedelta(hours=1)), basic.noop)
    assert app.get_run(app.trigger("nightly")).tenant is None


def test_runs_show_and_listing_show_the_tenant(app):
    run_id = app.enqueue(basic.noop, tenant="acme")
    url, ns = app.redis_url, app.keys.namespace
    assert "tenant            acme" in ok(cli(url, ns, "runs", "show", run_id))
    rows = as_json(cli(url, ns, "runs", "list", "--json"))
    assert [r["tenant"] for r in rows if r["id"] == run_id] == ["acme"]
