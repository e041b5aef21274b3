"""The console over HTTP, in-process (Starlette's test client) against a real Valkey: what each
page shows, and the write rules (read-only by default, the write token, CSRF, origin)."""

from __future__ import annotations

import re
from datetime import timedelta

import duetime
from duetime.app import App
from duetime.ops.inspect import Inspector
from duetime.web.console import Console
from tests.apps import webapp
from tests.integration.opkit import Driver
from tests.web.conftest import TOKEN


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def unlocked(client, token: str = TOKEN) -> str:
    """Unlock writes in this client's session; → the session's CSRF token."""
    csrf = csrf_of(client.get("/unlock").text)
    res = client.post("/unlock", data={"token": token, "csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303, res.text
    return csrf


def test_every_page_renders_and_names_the_namespace(console, wapp, namespace):
    wapp.schedule("nightly", duetime.Cron("30 2 * * *", tz="Europe/Paris"), webapp.tick)
    run_id = webapp.tick.enqueue()
    c = console()
    for path in ("/", "/schedules", "/schedules?order=next", "/schedules/nightly", "/runs",
                 f"/runs/{run_id}", "/dead", "/uncertain", "/leases", "/workers", "/unlock",
                 "/runs?state=scheduled&queue=default", "/dead/replay"):
        res = c.get(path)
        assert res.status_code == 200, (path, res.text[:500])
        assert f"namespace <code>{namespace}</code>" in res.text, path
        assert res.headers["cache-control"] == "no-store"
    assert run_id in c.get("/runs").text


def test_the_header_never_shows_the_password():
    app = App(redis_url="redis://ops:s3cr3t-pw@127.0.0.1:1/0", namespace="n1")
    where = Console(app).where()
    assert "s3cr3t-pw" not in where["redis"] and "ops:***@127.0.0.1:1" in where["redis"]


def test_read_only_console_refuses_every_write(console, wapp):
    wapp.schedule("every", duetime.Every(timedelta(seconds=60)), webapp.tick)
    c = console()  # no write token
    page = c.get("/schedules/every").text
    assert 'id="mode"' in page and "read-only" in page and "disabled" in page
    csrf = csrf_of(page)
    for path in ("/schedules/every/pause", "/schedules/every/trigger", "/unlock", "/dead/replay"):
        res = c.post(path, data={"csrf": csrf, "token": TOKEN})
        assert res.status_code == 403 and "read-only" in res.text, path
    info = wapp.get_schedule("every")
    assert not info.paused and info.materialized_count == 0


def test_writes_need_the_token_and_a_csrf_token_of_the_session(console, wapp):
    wapp.schedule("every", duetime.Every(timedelta(seconds=60)), webapp.tick)
    c = console(TOKEN)
    csrf = csrf_of(c.get("/schedules/every").text)
    # locked: right CSRF token, no unlock yet
    assert c.post("/schedules/every/pause", data={"csrf": csrf}).status_code == 403
    # a wrong token does not unlock
    res = c.post("/unlock", data={"token": "not-the-token-at-all", "csrf": csrf}, follow_redirects=False)
    assert res.status_code == 403
    csrf = unlocked(c)
    # unlocked: still no write without the CSRF token, or with another session's
    assert c.post("/schedules/every/pause", data={}).status_code == 403
    other = console(TOKEN)
    other_csrf = csrf_of(other.get("/").text)
    res = c.post("/schedules/every/pause", data={"csrf": other_csrf})
    assert res.status_code == 403 and "CSRF" in res.text
    # another site's page, even with the right token
    res = c.post("/schedules/every/pause", data={"csrf": csrf}, headers={"origin": "http://evil.example"})
    assert res.status_code == 403
    assert not wapp.get_schedule("every").paused
    res = c.post("/schedules/every/pause", data={"csrf": csrf, "note": "vendor outage"},
                 follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/schedules/every?flash=paused"
    info = wapp.get_schedule("every")
    assert info.paused and info.pause_note == "vendor outage"


def test_session_cookies_are_http_only_and_same_site(console):
    res = console(TOKEN).get("/")
    cookie = res.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_payloads_are_hidden_unless_asked_for_one_run(console, wapp):
    secret = "card-4111-1111-1111-1111"
    run_id = wapp.enqueue("web.charge", kwargs={"invoice": 1}, key="inv-1")
    wapp.enqueue("web.slow", kwargs={"seconds": secret})
    c = console()
    for path in ("/runs", "/runs?state=scheduled", "/", "/dead"):
        assert secret not in c.get(path).text, path
    listing = Inspector(wapp.store.client, wapp.keys, wapp.redis_url).list_runs(limit=10)
    secret_run = next(s.id for s in listing.runs if s.task == "web.slow")
    assert secret not in c.get(f"/runs/{secret_run}").text
    assert secret in c.get(f"/runs/{secret_run}?payload=1").text
    assert run_id in c.get("/runs").text


def test_errors_are_pages_with_their_status(console):
    c = console()
    assert c.get("/runs/no-such-run").status_code == 404
    assert c.get("/schedules/no-such-schedule").status_code == 404
    assert c.get("/schedules?name=no-such-schedule").status_code == 404
    res = c.get("/runs?state=bogus")
    assert res.status_code == 400 and "unknown state" in res.text
    assert c.get("/runs?after=garbage").status_code == 400
    assert c.get("/schedules/x?until=yesterday").status_code == 400


def test_dead_letters_by_owner_and_replay_all_with_a_confirmation(console, wapp):
    d = Driver(wapp)
    ids = d.dead(webapp.charge, 3, [1])
    c = console(TOKEN)
    page = c.get("/dead").text
    assert "payments: 3" in page and all(i in page for i in ids)
    confirm = c.get("/dead/replay?owner=payments").text
    assert re.search(r'id="count">3<', confirm)
    assert c.get("/dead/replay?owner=nobody").text.count('id="count">0<') == 1
    csrf = unlocked(c)
    res = c.post("/dead/replay", data={"csrf": csrf, "owner": "payments"})
    assert res.status_code == 200 and "Replayed 3 dead letter(s)" in res.text
    insp = Inspector(wapp.store.client, wapp.keys, wapp.redis_url)
    assert insp.list_runs("dead").runs == []
    for old in ids:
        new = insp.get_run(old).replayed_by
        assert new and insp.get_run(new).state == "scheduled" and new in res.text


def test_an_uncertain_run_is_resolved_from_its_confirmation_page(console, wapp):
    (run_id,) = Driver(wapp).uncertain(webapp.transfer, 1)
    c = console(TOKEN)
    assert run_id in c.get("/uncertain").text
    page = c.get(f"/runs/{run_id}/confirm/resolve?as=failed").text
    assert "dead letter" in page
    csrf = unlocked(c)
    res = c.post(f"/runs/{run_id}/resolve",
                 data={"csrf": csrf, "verdict": "failed", "note": "no money moved"},
                 follow_redirects=False)
    assert res.status_code == 303
    run = wapp.get_run(run_id)
    assert run.state == "dead" and run.resolved_as == "failed"
    # the same action again is refused with the reason, not a traceback
    res = c.post(f"/runs/{run_id}/resolve", data={"csrf": csrf, "verdict": "failed"})
    assert res.status_code == 409 and "not uncertain" in res.text


def test_the_overview_shows_the_cost_of_retries_by_owner(console, wapp):
    from duetime.common import retrycost

    c = console()
    assert 'id="retry-cost"' not in c.get("/").text  # no attempt counted yet: no section
    r = wapp.store.ready()
    now_ms = Inspector(r, wapp.keys, wapp.redis_url).now_ms()
    for cmd in retrycost.commands(wapp.keys, {("send-invoice", "billing"): [3, 2, 1500]}, now_ms):
        r.execute_command(*cmd)
    html = c.get("/").text
    row = re.search(r'<tr id="cost-send-invoice">(.*?)</tr>', html, re.S)
    assert row, html[-2000:]
    cells = [re.sub(r"<[^>]+>", "", x).strip()
             for x in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    assert cells == ["send-invoice", "billing", "3", "2", "1.5s", "3", "2", "1.5s"], cells
    assert '/dead?owner=billing' in row.group(1)


def test_a_succeeded_run_page_shows_its_result_in_its_own_block(wapp):
    import html

    from duetime.common import transitions as tr
    from duetime.common.codec import pack_result
    from starlette.testclient import TestClient

    from duetime.web.server import create_app

    d = Driver(wapp)
    result = {"receipt": "<b>r-77</b>", "lines": ["y" * 50] * 20}
    run_id = wapp.enqueue("web.tick")
    (p, c), = d.claim_all()
    keys, args = tr.complete(d.k, p, [(c.run_id, c.fence, pack_result(result))])
    assert d.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    with TestClient(create_app(wapp), base_url="http://127.0.0.1") as client:
        hidden = client.get(f"/runs/{run_id}").text
        assert 'id="show-result"' in hidden and "r-77" not in hidden  # hidden like the payload
        page = client.get(f"/runs/{run_id}?payload=1").text
    m = re.search(r'<pre id="result-text">(.*?)</pre>', page, re.S)
    assert m, "no result block on the page"
    shown = html.unescape(m.group(1))
    assert shown.startswith('{"receipt": "<b>r-77</b>", "lines": ["yyy') and shown.endswith("…")
    assert len(shown) == 500
    assert "<b>r-77</b>" not in page  # escaped, never markup


def test_a_queue_is_paused_and_resumed_from_the_overview(console, wapp):
    from duetime.client.pause import QueuePauses

    pauses = QueuePauses(wapp.store.ready(), wapp.keys, wapp.redis_url)
    webapp.tick.enqueue()  # the queue appears on the overview
    c = console(token=TOKEN)
    csrf = csrf_of(c.get("/").text)
    assert c.post("/queues/default/pause", data={"csrf": csrf}).status_code == 403  # locked
    assert pauses.list() == []
    csrf = unlocked(c)
    res = c.post("/queues/default/pause", data={"csrf": csrf, "note": "partner down"},
                 follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/?flash=queue-paused"
    assert [(p.queue, p.note) for p in pauses.list()] == [("default", "partner down")]
    page = c.get("/?flash=queue-paused").text
    assert "Queue paused" in page and 'action="/queues/default/resume"' in page
    res = c.post("/queues/default/resume", data={"csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303 and pauses.list() == []
    assert 'action="/queues/default/pause"' in c.get("/").text
