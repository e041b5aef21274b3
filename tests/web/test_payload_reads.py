"""Listings and pages that do not show payloads do not read them: with runs and a schedule
carrying a 300 KB payload, the bytes the server sends while a page renders (INFO's
total_net_output_bytes, measured on the real server; the test is the only client of its
namespace's pages) stay far below one payload, and the pages that show a payload (the
control) read it."""

from __future__ import annotations

from datetime import timedelta

import redis
from starlette.testclient import TestClient

import duetime
from duetime.web.server import create_app
from tests.apps import webapp
from tests.integration.opkit import Driver, cli

BIG = 300_000


def sent_by(admin: redis.Redis, action) -> int:  # type: ignore[no-untyped-def]
    """Bytes the server sent while `action` ran (INFO's own reply, a few KB, included)."""
    before = int(admin.info("stats")["total_net_output_bytes"])
    action()
    return int(admin.info("stats")["total_net_output_bytes"]) - before


def test_pages_without_payloads_do_not_read_them(wapp, server, namespace):
    d = Driver(wapp)
    dead = d.dead(webapp.charge, 1, args=["x" * BIG])[0]
    waiting = webapp.charge.options(delay=3600).enqueue("y" * BIG)
    wapp.schedule("bulky", duetime.Every(timedelta(hours=1)), webapp.tick, args=["z" * BIG])
    admin = redis.Redis(port=server.port)
    c = TestClient(create_app(wapp), base_url="http://127.0.0.1")
    try:
        c.get("/")  # warm-up: the doctor's cache, the scripts loaded on connect

        def page(url: str) -> int:
            def get() -> None:
                res = c.get(url)
                assert res.status_code == 200, (url, res.text[-500:])
            return sent_by(admin, get)

        for url in ("/runs", "/runs?state=scheduled", "/dead", "/schedules", "/schedules/bulky",
                    f"/runs/{dead}", f"/runs/{waiting}", f"/runs/{dead}/confirm/replay", "/"):
            assert page(url) < BIG / 3, url
        # the control: a page that shows the payload reads it
        assert page(f"/runs/{dead}?payload=1") > BIG
        assert page("/schedules/bulky?payload=1") > BIG
        url, ns = server.url, namespace
        assert sent_by(admin, lambda: cli(url, ns, "schedule", "list")) < BIG / 3
        assert sent_by(admin, lambda: cli(url, ns, "runs", "list")) < BIG / 3
        assert sent_by(admin, lambda: cli(url, ns, "schedule", "list", "--json")) > BIG
    finally:
        c.close()
        admin.close()


def test_a_page_without_the_payload_still_shows_everything_else(wapp):
    run_id = webapp.charge.options(delay=3600).enqueue(42)
    wapp.schedule("plain", duetime.Every(timedelta(hours=1)), webapp.tick)
    full = wapp.get_run(run_id)
    from duetime.ops.inspect import Inspector

    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    light = insp.get_run(run_id, large=False)
    assert light.args == [] and full.args == [42]
    assert {**vars(light), "args": None} == {**vars(full), "args": None}
    from duetime.client.schedules import ScheduleStore

    store = ScheduleStore(wapp.store.client, wapp.keys, wapp.redis_url)
    assert {**vars(store.get("plain", payload=False)), "args": None} == {
        **vars(store.get("plain")), "args": None}
