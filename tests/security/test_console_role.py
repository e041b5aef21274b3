"""The web console under the ACL roles docs/operations.md gives it, on real Redis and Valkey
servers: every page of the console renders under `duetime-console` (read-only) with no
refusal in ACL LOG, a write action under it is refused and changes nothing, and every write
action of the console works under `duetime-console-write`."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import redis
from duetime.common import series
from starlette.routing import Route
from starlette.testclient import TestClient

import duetime
from duetime.embedded import EmbeddedServer
from duetime.ops.inspect import Inspector
from duetime.web.server import create_app
from tests.apps import chaos as chaos_app
from tests.integration.opkit import Driver
from tests.security.roles import Role, refusals
from tests.security.test_acl import ALLOWED_REFUSALS, snapshot

TOKEN = "console-role-token-0123456789"


def seed(server: EmbeddedServer, namespace: str) -> dict[str, str]:
    """Runs in every index, a schedule, a live worker and a series sample (as the default user):
    each page then reads what it reads in production, not an empty namespace."""
    app = chaos_app.app
    app.configure(redis_url=server.url, namespace=namespace)
    d = Driver(app)
    dead = d.dead(chaos_app.failing, 2)
    done = d.succeeded(chaos_app.quick, 1)[0]
    unsure = d.uncertain(chaos_app.nonidem, 1)[0]
    running = chaos_app.quick.enqueue(0.0)
    d.claim_all()  # `running` holds a lease now
    waiting = chaos_app.quick.options(delay=3600).enqueue(0.0)
    app.schedule("console-sched", duetime.Every(timedelta(hours=1)), chaos_app.tick)
    k = app.keys
    d.r.zadd(k.workers, {"w-console": d.r.time()[0] * 1000})
    d.r.hset(k.worker("w-console"), mapping={"host": "h", "pid": 1, "queues": "default",
                                             "concurrency": 4, "inflight": 1, "processed": 3})
    ov = Inspector(d.r, k, server.url).overview()
    d.r.xadd(k.series("10s"), series.encode(ov))  # type: ignore[arg-type]
    app.enqueue_many([{"task": chaos_app.quick, "args": [0.0], "delay": 3600}] * 60)  # > a page
    batch = app.batch([(chaos_app.quick, [0.0])] * 3, on_complete=chaos_app.tick)
    return {"dead": dead[0], "dead2": dead[1], "done": done, "unsure": unsure,
            "running": running, "waiting": waiting, "sched": "console-sched", "batch": batch}


def console(role: Role, port: int, namespace: str, token: str | None = None
            ) -> tuple[TestClient, duetime.App, Any]:
    app = duetime.App(redis_url=role.url(port), namespace=namespace)
    asgi = create_app(app, token)
    return TestClient(asgi, base_url="http://127.0.0.1"), app, asgi


def pages(ids: dict[str, str]) -> dict[str, list[str]]:
    """Each GET route of the console -> the URLs this test renders for it."""
    return {
        "/": ["/", "/?window=24h"],
        "/runs": ["/runs", "/runs?state=dead", "/runs?state=running", "/runs?state=scheduled",
                  "/runs?state=uncertain", "/runs?state=succeeded", "/runs?state=retrying",
                  "/runs?task=chaos.quick&queue=default", "/runs?schedule=console-sched",
                  "/runs?owner=nobody"],
        "/runs/{run_id:path}/confirm/{action}": [
            f"/runs/{ids['dead']}/confirm/replay", f"/runs/{ids['unsure']}/confirm/resolve?as=failed",
            f"/runs/{ids['waiting']}/confirm/cancel"],
        "/runs/{run_id:path}": [f"/runs/{i}" for i in ids.values() if i not in (ids["sched"], ids["batch"])]
                               + [f"/runs/{ids['done']}?payload=1"],
        "/dead": ["/dead", "/dead?owner=nobody&task=chaos.failing"],
        "/dead/replay": ["/dead/replay", "/dead/replay?task=chaos.failing"],
        "/dead/selected": [f"/dead/selected?action=replay&run={ids['dead']}&run={ids['dead2']}",
                           f"/dead/selected?action=delete&run={ids['dead']}"],
        "/dead/purge": ["/dead/purge", "/dead/purge?before=2030-01-01T00:00:00Z"],
        "/search": ["/search", f"/search?q={ids['done']}&x=1", "/search?q=console-sched"],
        "/uncertain": ["/uncertain", "/uncertain?queue=default"],
        "/schedules": ["/schedules", "/schedules?order=next"],
        "/schedules/{name:path}": ["/schedules/console-sched", "/schedules/console-sched?payload=1",
                                   "/schedules/console-sched?until=2030-01-01T00:00:00Z"],
        "/leases": ["/leases"],
        "/workers": ["/workers", "/workers?all=1"],
        "/unlock": ["/unlock"],
        "/batches": ["/batches"],
        "/batches/{batch_id}": [f"/batches/{ids['batch']}"],
        "/healthz": ["/healthz"],
        "/readyz": ["/readyz"],
    }


def get_routes(asgi: Any) -> set[str]:
    app = asgi
    while not hasattr(app, "routes"):  # the console's own middleware (edges, mount prefix)
        app = app.app
    return {r.path for r in app.routes if isinstance(r, Route) and "GET" in (r.methods or ())}


def own_refusals(server: EmbeddedServer, rs: dict[str, Role], name: str) -> list[dict[str, Any]]:
    admin = redis.Redis(port=server.port)
    try:
        return [r for r in refusals(admin, {name: rs[name]})
                if (r["reason"], r["object"]) not in ALLOWED_REFUSALS]
    finally:
        admin.close()


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def unlock(c: TestClient) -> str:
    csrf = csrf_of(c.get("/unlock").text)
    res = c.post("/unlock", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303, res.text
    return csrf


def test_every_page_of_the_console_renders_under_the_console_role(acl, namespace: str) -> None:
    server, rs = acl
    ids = seed(server, namespace)
    for name in ("console", "console-write"):
        c, app, asgi = console(rs[name], server.port, namespace, TOKEN if name == "console-write" else None)
        try:
            urls = pages(ids)
            assert set(urls) == get_routes(asgi), "a GET route of the console is not rendered here"
            for group in urls.values():
                for url in group:
                    res = c.get(url)
                    assert res.status_code == 200, (name, url, res.text[-800:])
            # a listing's next page starts at a position inside the indexes (by score)
            for url in ("/runs", "/runs?state=scheduled"):
                m = re.search(r'id="next-page" href="([^"]+)"', c.get(url).text)
                assert m, f"{url} has no next page"
                nxt = c.get(url.split("?")[0] + m.group(1).replace("&amp;", "&"))
                assert nxt.status_code == 200 and "chaos.quick" in nxt.text, nxt.text[-500:]
            res = c.get("/schedules?name=console-sched", follow_redirects=False)
            assert res.status_code == 303
        finally:
            c.close()
            app.close()
        assert not own_refusals(server, rs, name), (name, own_refusals(server, rs, name))


def test_the_console_role_refuses_every_write_and_changes_nothing(acl, namespace: str) -> None:
    server, rs = acl
    ids = seed(server, namespace)
    before = snapshot(server.port, namespace)
    c, app, _ = console(rs["console"], server.port, namespace, TOKEN)  # a token, a read-only user
    try:
        csrf = unlock(c)
        for path, data in ((f"/runs/{ids['waiting']}/cancel", {}),
                           (f"/runs/{ids['dead']}/replay", {}),
                           (f"/runs/{ids['unsure']}/resolve", {"verdict": "failed"}),
                           ("/schedules/console-sched/pause", {}),
                           ("/schedules/console-sched/trigger", {}),
                           ("/dead/replay", {}),
                           ("/dead/selected", {"action": "delete", "run": ids["dead"]}),
                           ("/dead/purge", {})):
            res = c.post(path, data={"csrf": csrf, **data}, follow_redirects=False)
            assert res.status_code == 403, (path, res.status_code, res.text[-500:])
            text = res.text.lower()
            assert "no permissions" in text and "docs/operations.md" in text, (path, res.text[-600:])
    finally:
        c.close()
        app.close()
    assert snapshot(server.port, namespace) == before


def test_every_write_of_the_console_works_under_the_console_write_role(acl, namespace: str) -> None:
    server, rs = acl
    ids = seed(server, namespace)
    c, app, _ = console(rs["console-write"], server.port, namespace, TOKEN)
    try:
        csrf = unlock(c)
        for path, data in ((f"/runs/{ids['waiting']}/cancel", {}),
                           (f"/runs/{ids['dead']}/replay", {}),
                           (f"/runs/{ids['done']}/replay", {"force": "1"}),
                           (f"/runs/{ids['unsure']}/resolve", {"verdict": "failed"}),
                           ("/schedules/console-sched/pause", {"note": "maintenance"}),
                           ("/schedules/console-sched/resume", {}),
                           ("/schedules/console-sched/trigger", {})):
            res = c.post(path, data={"csrf": csrf, **data}, follow_redirects=False)
            assert res.status_code == 303, (path, res.status_code, res.text[-500:])
        res = c.post("/dead/replay", data={"csrf": csrf}, follow_redirects=False)
        assert res.status_code == 200 and ids["dead2"] in res.text, res.text[-500:]
        (extra,) = Driver(chaos_app.app).dead(chaos_app.failing, 1)
        res = c.post("/dead/selected", data={"csrf": csrf, "action": "delete",
                                             "run": [extra, ids["dead2"]]}, follow_redirects=False)
        assert res.status_code == 200 and "Deleted 1 dead letter(s)" in res.text  # dead2 replayed
        res = c.post("/dead/purge", data={"csrf": csrf, "before": "2000-01-01T00:00:00Z"},
                     follow_redirects=False)
        assert res.status_code == 200 and "Deleted 0 dead letter(s)" in res.text, res.text[-500:]
        assert c.post("/lock", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    finally:
        c.close()
        app.close()
    admin = duetime.App(redis_url=server.url, namespace=namespace)
    try:
        assert admin.get_run(ids["waiting"]).state == "cancelled"
        assert admin.get_run(ids["dead"]).replayed_by
        assert admin.get_run(ids["dead2"]).replayed_by
        assert admin.get_run(ids["unsure"]).state == "dead"
        with pytest.raises(duetime.RunNotFound):
            admin.get_run(extra)
        assert not admin.get_schedule("console-sched").paused
    finally:
        admin.close()
    assert not own_refusals(server, rs, "console-write")
