"""Django on the tests' private PostgreSQL (tests/apps/django_settings.py, the tiny app
tests.apps.djangoshop): a run enqueued inside `transaction.atomic()` exists only after the
commit and never after a rollback, by `transaction.on_commit` and by the outbox; schedules are
declared by a management command. The how-to: docs/howto/django.md."""

from __future__ import annotations

import io
import os
import uuid

import psycopg
import pytest

from duetime import outbox
from tests.integration.inproc import burst
from tests.outbox.test_outbox import _rows, _run_count

django = pytest.importorskip("django", reason="the Django test needs Django (the test extra)")


@pytest.fixture(scope="module")
def site(pg_dsn, servers):
    """Django set up once for this module's process, on a database of its own."""
    name = f"dj{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    dsn = pg_dsn.rsplit("/", 1)[0] + f"/{name}"
    saved = {k: os.environ.get(k) for k in ("DUETIME_TEST_PG_DSN", "DJANGO_SETTINGS_MODULE",
                                             "DUETIME_REDIS_URL", "DUETIME_NAMESPACE")}
    os.environ.update(DUETIME_TEST_PG_DSN=dsn, DJANGO_SETTINGS_MODULE="tests.apps.django_settings",
                      DUETIME_REDIS_URL=servers["valkey"].url, DUETIME_NAMESPACE="djsite")
    try:
        django.setup()
        from django.core.management import call_command

        call_command("migrate", run_syncdb=True, verbosity=0)
        from django.db import connection

        outbox.create_table(connection)
        yield dsn
        connection.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def shop(site, servers, r):
    from tests.apps.djangoshop.jobs import app

    namespace = f"t{uuid.uuid4().hex[:10]}"
    app.configure(redis_url=servers["valkey"].url, namespace=namespace)
    yield app, namespace
    app.close()


def test_on_commit_enqueues_after_the_commit_and_never_after_a_rollback(shop, r):
    from django.db import transaction

    from tests.apps.djangoshop.jobs import confirm
    from tests.apps.djangoshop.models import Order

    app, namespace = shop
    ids: list[str] = []
    with transaction.atomic():
        order = Order.objects.create(item="book")
        transaction.on_commit(lambda: ids.append(confirm.enqueue(order.pk)))
        assert ids == [] and _run_count(r, namespace) == 0  # nothing before the commit
    assert len(ids) == 1 and _run_count(r, namespace) == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(item="lamp")
        transaction.on_commit(lambda: ids.append(confirm.enqueue(-1)))
        raise RuntimeError("rolled back")
    assert len(ids) == 1 and _run_count(r, namespace) == 1
    burst(app)
    assert app.wait(ids[0], timeout=30) is None  # the worker found the committed order


def test_the_outbox_through_django_s_connection(shop, site, r):
    from django.db import connection, transaction

    from tests.apps.djangoshop.jobs import confirm
    from tests.apps.djangoshop.models import Order

    app, namespace = shop
    with transaction.atomic():
        order = Order.objects.create(item="pen")
        row = outbox.enqueue(connection, confirm, [order.pk])
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.enqueue(connection, confirm, [Order.objects.create(item="ink").pk])
        raise RuntimeError("rolled back")
    assert _rows(site) == 1
    with psycopg.connect(site) as conn:
        assert outbox.relay_once(conn, app) == 1
    assert _run_count(r, namespace) == 1
    from duetime.client.runs import keyed_run_id

    run_id = keyed_run_id("shop.confirm", outbox.run_key(row))
    assert app.get_run(run_id).args == [order.pk]
    burst(app)
    assert app.wait(run_id, timeout=30) is None


def test_a_management_command_declares_the_schedules(shop):
    from django.core.management import call_command

    app, _ = shop
    out = io.StringIO()
    call_command("declare_schedules", stdout=out)
    assert out.getvalue().splitlines() == ["shop.nightly-confirm: created", "shop.poll: created"]
    out = io.StringIO()
    call_command("declare_schedules", stdout=out)  # at the next deploy: nothing changes
    assert out.getvalue().splitlines() == ["shop.nightly-confirm: unchanged", "shop.poll: unchanged"]
    assert {s.name for s in app.list_schedules()} == {"shop.nightly-confirm", "shop.poll"}
