"""The console's on-call basics over HTTP (the console served in-process, a real Valkey): dead
letters selected and replayed or deleted, purged (all, or those dead before an instant), each
behind the write token, the CSRF token and the origin check; the header's search; a failed
run's one-line reason and its traceback block without duetime's frames; the throughput chart's
axes and totals."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime

import duetime
from duetime.ops.inspect import Inspector
from tests.apps import webapp
from tests.integration.inproc import burst
from tests.integration.opkit import Driver
from tests.web.conftest import TOKEN
from tests.web.test_console import csrf_of, unlocked


def insp(wapp) -> Inspector:
    return Inspector(wapp.store.client, wapp.keys, wapp.redis_url)


def dead_index(wapp) -> set[str]:
    r, k = wapp.store.client, wapp.keys
    return {m.decode() for p in range(k.partitions) for m in r.zrange(k.dead(p), 0, -1)}


def exists(wapp, run_id: str) -> bool:
    k = wapp.keys
    return bool(wapp.store.client.exists(k.run(k.partition_of_run(run_id), run_id)))


def test_selected_dead_letters_are_replayed_after_a_confirmation(console, wapp):
    a, b, c_ = Driver(wapp).dead(webapp.charge, 3, [1])
    c = console(TOKEN)
    page = c.get("/dead").text
    for run_id in (a, b, c_):
        assert f'name="run" value="{run_id}" form="selected-form"' in page
    confirm = c.get("/dead/selected", params=[("action", "replay"), ("run", a), ("run", b)])
    assert confirm.status_code == 200
    assert a in confirm.text and b in confirm.text and c_ not in confirm.text
    assert f'<input type="hidden" name="run" value="{a}">' in confirm.text
    form = {"csrf": csrf_of(confirm.text), "action": "replay", "run": [a, b]}
    # writes locked in this session: refused, nothing replayed
    res = c.post("/dead/selected", data=form)
    assert res.status_code == 403 and "Writes are locked" in res.text
    assert not insp(wapp).get_run(a).replayed_by
    csrf = unlocked(c)
    res = c.post("/dead/selected", data={"action": "replay", "run": [a, b]})  # no CSRF
    assert res.status_code == 403 and "CSRF" in res.text
    form["csrf"] = csrf
    res = c.post("/dead/selected", data=form, headers={"Origin": "http://evil.example"})
    assert res.status_code == 403 and "another site" in res.text
    assert not insp(wapp).get_run(a).replayed_by and not insp(wapp).get_run(b).replayed_by
    res = c.post("/dead/selected", data=form)
    assert res.status_code == 200 and "Replayed 2 dead letter(s)" in res.text
    for old in (a, b):
        new = insp(wapp).get_run(old).replayed_by
        assert new and new in res.text and insp(wapp).get_run(new).state == "scheduled"
    assert insp(wapp).get_run(c_).replayed_by is None
    assert dead_index(wapp) == {c_}
    # the same selection again: nothing is still a dead letter, nothing replayed twice
    again = c.post("/dead/selected", data=form)
    assert "Replayed 0 dead letter(s)" in again.text


def test_selected_dead_letters_are_deleted_and_others_are_left_alone(console, wapp):
    a, b, c_ = Driver(wapp).dead(webapp.charge, 3, [1])
    (done,) = Driver(wapp).succeeded(webapp.tick, 1)
    c = console(TOKEN)
    confirm = c.get("/dead/selected", params=[("action", "delete"), ("run", a), ("run", b),
                                              ("run", done)]).text
    assert "deleted for good" in confirm and done not in confirm.split('id="selected"')[1]
    csrf = csrf_of(confirm)
    form = {"csrf": csrf, "action": "delete", "run": [a, b, done]}
    assert c.post("/dead/selected", data=form).status_code == 403  # locked
    assert exists(wapp, a) and exists(wapp, b)
    form["csrf"] = unlocked(c)
    res = c.post("/dead/selected", data=form)
    assert res.status_code == 200 and "Deleted 2 dead letter(s)" in res.text, res.text
    assert not exists(wapp, a) and not exists(wapp, b)
    assert exists(wapp, c_) and exists(wapp, done)  # not selected; not a dead letter
    assert insp(wapp).get_run(done).state == "succeeded"
    assert dead_index(wapp) == {c_}
    res = c.get("/dead/selected?action=delete", follow_redirects=True)  # nothing ticked
    assert "No dead letter was selected" in res.text


def test_purge_deletes_the_dead_letters_before_an_instant_then_all(console, wapp):
    d = Driver(wapp)
    old = d.dead(webapp.charge, 2, [1])
    new = d.dead(webapp.charge, 2, [2])
    r, k = wapp.store.client, wapp.keys
    for run_id in old:  # dead-lettered an hour ago (the index's score is when)
        p = k.partition_of_run(run_id)
        r.zadd(k.dead(p), {run_id: int(r.zscore(k.dead(p), run_id)) - 3_600_000}, xx=True)
    cut = datetime.fromtimestamp((insp(wapp).now_ms() - 1_800_000) / 1000, UTC).isoformat()
    read_only = console()
    res = read_only.post("/dead/purge", data={"csrf": csrf_of(read_only.get("/dead/purge").text)})
    assert res.status_code == 403 and "read-only" in res.text
    c = console(TOKEN)
    page = c.get("/dead/purge", params={"before": cut}).text
    assert re.search(r'id="count">2<', page), page
    assert re.search(r'id="count">4<', c.get("/dead/purge").text)
    assert c.post("/dead/purge", data={"csrf": csrf_of(page), "before": cut}).status_code == 403
    assert dead_index(wapp) == set(old + new)
    csrf = unlocked(c)
    assert c.post("/dead/purge", data={"before": cut}).status_code == 403  # no CSRF token
    res = c.post("/dead/purge", data={"csrf": csrf, "before": cut})
    assert res.status_code == 200 and "Deleted 2 dead letter(s)" in res.text
    assert dead_index(wapp) == set(new)
    assert not any(exists(wapp, i) for i in old) and all(exists(wapp, i) for i in new)
    res = c.post("/dead/purge", data={"csrf": csrf})
    assert "Deleted 2 dead letter(s)" in res.text and dead_index(wapp) == set()
    assert not any(exists(wapp, i) for i in new)
    assert c.get("/dead/purge", params={"before": "yesterday"}).status_code == 400


def test_search_goes_to_a_run_a_key_s_run_or_a_schedule(console, wapp):
    plain = webapp.tick.enqueue()
    keyed = wapp.enqueue(webapp.tick, key="order-7")
    wapp.schedule("nightly-report", duetime.Cron("0 3 * * *", tz="UTC"), webapp.tick)
    c = console()
    assert 'action="/search"' in c.get("/").text  # the box in every page's header

    def goes(q: str) -> str:
        res = c.get("/search", params={"q": q}, follow_redirects=False)
        assert res.status_code == 303, (q, res.status_code, res.text[-500:])
        return res.headers["location"]

    assert goes(plain) == f"/runs/{plain}"
    assert goes(keyed) == f"/runs/{keyed}"
    assert goes("order-7") == f"/runs/{keyed}"  # through the key's run id
    assert goes("nightly-report") == "/schedules/nightly-report"
    res = c.get("/search", params={"q": "no-such-thing"})
    assert res.status_code == 404
    assert "Nothing found for" in res.text and "no-such-thing" in res.text
    assert c.get("/search").status_code == 200  # an empty search explains itself


def test_a_failed_run_shows_a_one_line_reason_and_its_traceback_without_duetime_frames(console,
                                                                                         wapp):
    from duetime.worker.errors import PACKAGE_DIRS

    run_id = webapp.charge.enqueue(42)
    burst(wapp)
    run = wapp.get_run(run_id)
    assert run.state == "dead"
    error = run.error or ""
    assert error.startswith("Fatal: card processor rejected invoice 42\nTraceback")
    assert 'webapp.py", line' in error and "in charge" in error  # the user's frame is kept
    files = re.findall(r'File "([^"]+)"', error)
    assert files and not [f for f in files if f.startswith(PACKAGE_DIRS)], error
    assert "execution.py" not in error and "asyncio" not in error
    c = console()
    page = c.get(f"/runs/{run_id}").text
    line = re.search(r'<p id="error-line"[^>]*>(.*?)</p>', page, re.S)
    assert line and html.unescape(line.group(1)).strip() == "Fatal: card processor rejected invoice 42"
    block = re.search(r'<pre id="error-text"[^>]*>(.*?)</pre>', page, re.S)
    assert block and "in charge" in html.unescape(block.group(1))
    row = re.search(rf'<tr>\s*<td><input[^>]+value="{run_id}".*?</tr>', c.get("/dead").text, re.S)
    assert row and "rejected invoice 42" in row.group(0) and "Traceback" not in row.group(0)


def test_the_throughput_chart_has_labelled_axes_and_the_window_s_totals(console, wapp):
    r, k = wapp.store.ready(), wapp.keys
    webapp.tick.enqueue()  # the queue appears on the overview
    now = insp(wapp).now_ms()
    t = now - now % 10_000
    # six samples 10 s apart: 2 runs/s finishing, dead letters going 0, 1, 1, 3, 3, 4
    for i, dead in enumerate([0, 1, 1, 3, 3, 4]):
        queues = {"default": [0, 0, 2.0, 0.1, 0.2, dead]}
        r.xadd(k.series("10s"), {"queues": json.dumps(queues), "leases": "0", "dead": str(dead),
                                 "uncertain": "0", "workers": "1"}, id=f"{t - (5 - i) * 10_000}-0")
    page = console().get("/").text
    m = re.search(r'<div class="throughput" id="throughput-default">(.*?)</div></div>', page, re.S)
    assert m, page[-3000:]
    block = m.group(1)
    svg = block[block.index("<svg"):block.index("</svg>")]
    assert "time (UTC)" in svg and ">runs/s</text>" in svg
    ticks = re.findall(r'<text class="xtick"[^>]*>(\d\d:\d\d)</text>', svg)
    assert ticks and all(0 <= int(x[:2]) < 24 for x in ticks)
    assert re.findall(r'<text class="ytick"[^>]*>([^<]+)</text>', svg) == ["0", "1", "2"]
    assert "<polyline" in svg
    totals = dict(re.findall(r'data-total="(\w+)">(\d+)<', block))
    assert totals == {"processed": "120", "failed": "4"}, totals


def test_duetime_frames_are_left_out_of_chained_tracebacks_too():
    from duetime.common.errors import InvalidInput
    from duetime.common.names import check_name
    from duetime.worker.errors import PACKAGE_DIRS, record_text

    def users_code() -> None:
        try:
            check_name("run id", "")  # raises inside duetime
        except InvalidInput as exc:
            raise RuntimeError("wrapped") from exc

    try:
        users_code()
    except RuntimeError as exc:
        text = record_text(exc)
    assert text.startswith("RuntimeError: wrapped\nTraceback")
    assert "direct cause" in text and "InvalidInput" in text and "in users_code" in text
    assert not [f for f in re.findall(r'File "([^"]+)"', text) if f.startswith(PACKAGE_DIRS)], text
    assert PACKAGE_DIRS and all(not d.rstrip("/").endswith("tests") for d in PACKAGE_DIRS)
