"""The console driven in headless Chromium against a real `duetime web`, real workers and a
real scheduler: what an operator does at 3 a.m., click by click. Each test takes screenshots
of the pages it visits: into docs/screenshots/ with DUETIME_SCREENSHOTS=1 (`make
screenshots`, what the README shows), else into the test's temporary folder."""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest

import duetime
from tests.apps import webapp
from tests.conftest import ROOT, wait_for
from tests.web import browser
from tests.web.conftest import TOKEN

pytestmark = pytest.mark.skipif(browser.find() is None, reason=browser.HOW_TO_GET)
APP = "tests.apps.webapp:app"
SHOTS = ROOT / "docs" / "screenshots"


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One browser for the module (each test gets a fresh cookie jar)."""
    d = browser.start(tmp_path_factory.mktemp("chromium-profile"))
    d.set_script_timeout(15)
    yield d
    d.quit()


@pytest.fixture
def page(chrome):
    chrome.delete_all_cookies()
    return chrome


def by(css: str):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, css


def text(d, css: str) -> str:
    """An element's text, read in one script call: live updates replace elements while a
    test looks at them."""
    return d.execute_script("const e = document.querySelector(arguments[0]);"
                            "return e ? e.innerText.trim() : '';", css)


def shot(d, name: str, tmp_path: Path) -> Path:
    """A screenshot of the whole page (up to 2,400 px tall), through Chromium's DevTools."""
    folder = SHOTS if os.environ.get("DUETIME_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    size = d.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 2400), "scale": 1}
    png = d.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                        "captureBeyondViewport": True})
    target = folder / f"web-{name}.png"
    target.write_bytes(base64.b64decode(png["data"]))
    assert target.stat().st_size > 5_000, target
    return target


def unlock(d, base: str) -> None:
    d.get(base + "/unlock")
    d.find_element(*by("#token")).send_keys(TOKEN)
    d.find_element(*by("#unlock")).click()
    wait_for(lambda: text(d, "#mode") == "writes unlocked", 10, what="writes unlocked")


def post_status(d, path: str, with_csrf: bool) -> int:
    """A POST from the page's own origin and session (fetch), with or without its CSRF token."""
    return d.execute_async_script("""
        const [path, withCsrf, done] = arguments;
        const body = new URLSearchParams();
        if (withCsrf) body.set('csrf', document.querySelector('meta[name=csrf-token]').content);
        fetch(path, {method: 'POST', body: body, credentials: 'same-origin'})
          .then(r => done(r.status), e => done(-1));
    """, path, with_csrf)


def test_overview_shows_a_queue_backlog_draining(page, wapp, web, procs, tmp_path):
    base = web()
    wapp.enqueue_many([(webapp.gated, [])] * 60)  # held until the gate opens, 4 at a time
    page.get(base + "/")
    backlog = "#queue-default [data-field=backlog]"
    assert text(page, backlog) == "60"
    page.execute_script("window.sameDocument = true")
    procs.duetime("scheduler", "--gauges-every", "200ms")
    procs.worker("--concurrency", "4", app=APP)
    seen: list[str] = []

    def drained() -> bool:
        value = text(page, backlog)
        if not seen or seen[-1] != value:
            seen.append(value)
        return value == "0"

    wait_for(lambda: drained() or (len(seen) > 1 and seen[-1] not in ("60", "")), 40,
             what="the backlog to start draining")
    page.switch_to.new_window("tab")  # the leases while runs are held
    page.get(base + "/leases")
    assert page.find_elements(*by("#leases .bar"))
    shot(page, "leases", tmp_path)
    page.close()
    page.switch_to.window(page.window_handles[0])
    webapp.r().set(webapp.gate_key(), 1)  # the held runs end, the rest follow
    wait_for(drained, 60, what="the backlog to drain to 0")
    # the numbers came in live, into the same document (no reload), and went down on the way
    assert page.execute_script("return window.sameDocument === true")
    values = [int(v) for v in seen if v.isdigit()]
    assert values[0] == 60 and values[-1] == 0 and any(0 < v < 60 for v in values), seen
    assert values == sorted(values, reverse=True), seen
    wait_for(lambda: "no live worker" not in text(page, "#workers"), 20, what="the worker listed")
    shot(page, "overview", tmp_path)
    page.get(base + "/runs")
    assert len(page.find_elements(*by("#runs tr"))) > 10
    shot(page, "runs", tmp_path)
    page.get(base + "/workers")
    shot(page, "workers", tmp_path)


def test_a_dead_letter_is_replayed_from_its_page_and_the_new_run_succeeds(page, wapp, web, procs,
                                                                          tmp_path):
    base = web(TOKEN)
    procs.worker(app=APP)
    run_id = webapp.charge.enqueue(42)
    wait_for(lambda: wapp.get_run(run_id).state == "dead", 30, what="the run to dead-letter")
    unlock(page, base)
    page.get(base + "/dead")
    assert "payments: 1" in text(page, "#owners")
    shot(page, "dead-letters", tmp_path)
    page.find_element(*by(f'#dead a[href="/runs/{run_id}"]')).click()
    assert "card processor rejected invoice 42" in text(page, "#error-text")
    page.find_element(*by("#replay")).click()
    wapp.store.client.set(webapp.fixed_key(), 1)  # meanwhile, the bug was fixed
    page.find_element(*by("#confirm button[type=submit]")).click()
    wait_for(lambda: "flash=replayed" in page.current_url, 10, what="the new run's page")
    new_id = unquote(page.current_url.split("/runs/", 1)[1].split("?")[0])
    assert new_id != run_id
    wait_for(lambda: text(page, "#run-state") == "succeeded", 30, what="the replay to succeed")
    new = wapp.get_run(new_id)
    assert new.state == "succeeded" and new.replay_of == run_id
    assert wapp.get_run(run_id).replayed_by == new_id
    shot(page, "run", tmp_path)


def test_an_uncertain_run_is_resolved(page, wapp, web, procs, tmp_path):
    base = web(TOKEN)
    procs.duetime("scheduler", "--reap-tick", "100ms")
    worker = procs.worker("--lease", "1s", app=APP)
    run_id = webapp.transfer.enqueue(100, 30.0)
    wait_for(lambda: wapp.get_run(run_id).state == "running", 30, what="the transfer to start")
    worker.send_signal(signal.SIGKILL)  # the worker is lost mid-transfer: did the money move?
    wait_for(lambda: wapp.get_run(run_id).state == "uncertain", 30, what="the run to be uncertain")
    unlock(page, base)
    page.get(base + "/uncertain")
    assert run_id in text(page, "#uncertain")
    shot(page, "uncertain", tmp_path)
    page.find_element(*by(f'#uncertain a[href="/runs/{run_id}/confirm/resolve?as=succeeded"]')).click()
    page.find_element(*by("#confirm input[name=note]")).send_keys("bank statement shows it")
    page.find_element(*by("#confirm button[type=submit]")).click()
    wait_for(lambda: "flash=resolved" in page.current_url, 10, what="the run's page")
    assert text(page, "#run-state") == "succeeded"
    run = wapp.get_run(run_id)
    assert run.state == "succeeded" and run.resolved_as == "succeeded"
    assert [a.outcome for a in run.attempts] == ["unknown"]  # the lost attempt stays on record


def test_a_paused_schedule_creates_no_run_while_paused(page, wapp, web, procs, tmp_path):
    base = web(TOKEN)
    wapp.schedule("heartbeat", duetime.Every(timedelta(seconds=1)), webapp.tick, owner="sre")
    wapp.schedule("paris-report", duetime.Cron("30 2 * * *", tz="Europe/Paris"), webapp.tick)
    wapp.schedule("witness", duetime.Every(timedelta(seconds=1)), webapp.tick)  # keeps firing
    procs.duetime("scheduler", "--tick", "100ms")
    procs.worker(app=APP)
    wait_for(lambda: wapp.get_schedule("heartbeat").materialized_count >= 3, 30,
             what="the schedule to fire")
    unlock(page, base)
    page.get(base + "/schedules/heartbeat")
    page.find_element(*by("#pause-form button[type=submit]")).click()
    wait_for(lambda: "paused" in text(page, "#sched-status"), 10, what="the paused badge")
    info = wapp.get_schedule("heartbeat")
    assert info.paused
    created = info.materialized_count
    # three occurrences pass with the scheduler evaluating throughout: the unpaused witness
    # schedule materializes three more (an event, not a pause the scheduler might sleep through)
    witnessed = wapp.get_schedule("witness").materialized_count
    wait_for(lambda: wapp.get_schedule("witness").materialized_count >= witnessed + 3, 30,
             what="three more occurrences of the witness schedule")
    assert wapp.get_schedule("heartbeat").materialized_count == created
    page.refresh()
    assert page.find_elements(*by('#timeline tr.occ[data-status="pending"]'))
    assert page.find_elements(*by('#timeline tr.occ[data-status="ran"]'))
    shot(page, "schedule", tmp_path)
    page.find_element(*by("form[action$='/resume'] button")).click()
    wait_for(lambda: wapp.get_schedule("heartbeat").materialized_count > created, 20,
             what="runs again after resuming")
    page.get(base + "/schedules/paris-report?until=2026-04-02T00:00:00Z")
    assert "DST" in text(page, "#timeline")
    page.get(base + "/schedules")
    shot(page, "schedules", tmp_path)


def test_read_only_refuses_a_write_and_a_post_without_csrf_is_refused(page, wapp, web, tmp_path):
    wapp.schedule("nightly", duetime.Cron("0 3 * * *", tz="UTC"), webapp.tick)
    read_only = web()
    page.get(read_only + "/schedules/nightly")
    assert text(page, "#mode") == "read-only"
    assert not page.find_element(*by("#pause-form button")).is_enabled()
    assert post_status(page, "/schedules/nightly/pause", with_csrf=True) == 403
    assert not wapp.get_schedule("nightly").paused

    writable = web(TOKEN)
    unlock(page, writable)
    page.get(writable + "/schedules/nightly")
    assert post_status(page, "/schedules/nightly/pause", with_csrf=False) == 403
    assert not wapp.get_schedule("nightly").paused
    assert post_status(page, "/schedules/nightly/pause", with_csrf=True) == 200  # the control
    assert wapp.get_schedule("nightly").paused


def test_two_selected_dead_letters_are_replayed_in_one_action(page, wapp, web, tmp_path):
    from tests.integration.opkit import Driver

    base = web(TOKEN)
    a, b, c = Driver(wapp).dead(webapp.charge, 3, [7])
    unlock(page, base)
    page.get(base + "/dead")
    for run_id in (a, b):
        page.find_element(*by(f'#dead input[name=run][value="{run_id}"]')).click()
    # the list changes meanwhile (one more dead letter): a live refresh after it keeps the
    # selection (the region is not replaced while boxes are ticked)
    (late,) = Driver(wapp).dead(webapp.charge, 1, [8])
    before = page.execute_script("return document.body.getAttribute('data-refreshed')")
    wait_for(lambda: page.execute_script("return document.body.getAttribute('data-refreshed')")
             != before, 10, what="a live refresh of the page")
    checked = page.execute_script(
        "return [...document.querySelectorAll('#dead input[name=run]:checked')].map(e => e.value)")
    assert sorted(checked) == sorted([a, b]) and late not in text(page, "#dead")
    shot(page, "dead-selected", tmp_path)
    page.find_element(*by("#replay-selected")).click()
    wait_for(lambda: "/dead/selected" in page.current_url, 10, what="the confirmation page")
    listed = text(page, "#selected")
    assert a in listed and b in listed and c not in listed
    page.find_element(*by("#confirm button[type=submit]")).click()
    wait_for(lambda: "Replayed 2 dead letter(s)" in text(page, "h1"), 10, what="the replayed page")
    for old in (a, b):
        new = wapp.get_run(old).replayed_by
        assert new and new in text(page, "#replayed") and wapp.get_run(new).replay_of == old
    assert wapp.get_run(c).replayed_by is None
