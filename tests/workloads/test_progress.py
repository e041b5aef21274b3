"""`current_run().progress(done, total, note)` rides on the heartbeat: kept in the attempt's
context (no round trip per call), written to the run record by the next heartbeat under the
holder check, and shown by `runs show`, `--json` and the console's run page."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from duetime.common.context import PROGRESS_NOTE_MAX
from duetime.worker.leases import LeaseKeeper

import duetime
from tests.apps import longruns
from tests.integration.inproc import Gate, serving, until
from tests.integration.opkit import as_json, cli, ok
from tests.workloads.longrun_kit import Scripted, lapp

__all__ = ["lapp"]


def test_progress_shows_in_runs_show_json_after_a_heartbeat(lapp, url, namespace):
    async def main() -> tuple[str, dict, dict, str]:
        run_id = longruns.report.enqueue(250, 1000, "importing shard 3")
        async with serving(lapp) as w:
            gate = Gate(w)
            gate.open.clear()  # the worker's own beats held: the test sends the one beat
            await until(lambda: longruns.seen.get(run_id), 10, what="the task to report")
            before = as_json(cli(url, namespace, "runs", "show", run_id, "--json"))
            await LeaseKeeper.beat(w.leases)  # one heartbeat
            after = as_json(cli(url, namespace, "runs", "show", run_id, "--json"))
            text = ok(cli(url, namespace, "runs", "show", run_id))
            longruns.gates[run_id].set()
            gate.open.set()
        return run_id, before, after, text

    run_id, before, after, text = asyncio.run(main())
    assert before["state"] == "running" and before["progress"] is None  # not sent by the call
    p = after["progress"]
    assert (p["done"], p["total"], p["note"]) == (250, 1000, "importing shard 3")
    assert p["fraction"] == 0.25 and p["updated_at"] and p["age_s"] >= 0
    assert "progress          250 of 1000 (25%)  importing shard 3" in text
    assert lapp.get_run(run_id).progress.done == 250  # the read model too


def test_an_async_task_reports_progress_and_checkpoints(lapp, url, namespace):
    async def main() -> tuple[str, dict]:
        run_id = longruns.areport.enqueue(7, 9)
        async with serving(lapp) as w:
            gate = Gate(w)
            gate.open.clear()
            await until(lambda: longruns.seen.get(run_id), 10, what="the task to report")
            await LeaseKeeper.beat(w.leases)
            d = as_json(cli(url, namespace, "runs", "show", run_id, "--json"))
            longruns.gates[run_id].set()
            gate.open.set()
        return run_id, d

    run_id, d = asyncio.run(main())
    assert d["progress"]["done"] == 7 and d["progress"]["total"] == 9
    assert d["checkpoint"]["fence"] == 1 and d["checkpoint"]["size_bytes"] > 0
    assert lapp.get_run(run_id).state == "succeeded"


def test_the_console_run_page_shows_progress_checkpoint_and_continuations(lapp):
    import threading
    import time

    import httpx
    import uvicorn

    from duetime.web.server import create_app
    from tests.web.conftest import free_port

    s = Scripted(lapp)
    run_id = longruns.slices.enqueue(3)
    [c] = s.claim("wA")
    assert s.heartbeat(run_id, "wA:1", json.dumps({"done": 2, "total": 8, "note": "shard"})) == [1]
    assert s.continue_run(run_id, c.fence, 0, b"\x81\xa1i\x01") == "continued"
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(lapp), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.01)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            page = client.get(f"/runs/{run_id}")
    finally:
        server.should_exit = True
        thread.join(5)
    assert page.status_code == 200, page.text[:300]
    html = page.text
    assert 'id="progress"' in html and "2 of 8" in html and "25%" in html and "shard" in html
    assert 'id="checkpoint"' in html and "4 bytes, by fence 1" in html
    assert 'id="continuations">1<' in html


@pytest.mark.scripts
def test_the_heartbeat_writes_progress_only_for_the_holder(lapp):
    s = Scripted(lapp)
    run_id = longruns.report.enqueue(1, 2, None)
    [a] = s.claim("wA")
    body = json.dumps({"done": 1, "total": 2})
    assert s.heartbeat(run_id, "wA:1", body) == [1]
    assert s.field(run_id, "progress") == body.encode()
    at = s.field(run_id, "progress_at")
    assert at is not None and int(at) > 0
    assert s.heartbeat(run_id, "wA:1", "") == [1]  # unchanged: the last progress stays
    assert s.field(run_id, "progress") == body.encode()
    s.expire_and_reap(run_id)
    [b] = s.claim("wB")
    assert s.heartbeat(run_id, "wA:1", json.dumps({"done": 99})) == [0]  # stale: not written
    assert s.field(run_id, "progress") == body.encode()
    assert s.heartbeat(run_id, f"wB:{b.fence}", json.dumps({"done": 2})) == [1]
    assert lapp.get_run(run_id).progress.done == 2


def test_progress_checks_its_arguments_and_cuts_a_long_note():
    ctx = duetime.RunContext(run_id="r", task="t", queue="q", attempt=1, fence=1,
                             worker_id="w", idempotency_key="r", scheduled_at=None)
    assert ctx.pending_progress() is None
    ctx.progress(3)
    ctx.progress(4.5, 10, "x" * 1000)
    seq, body = ctx.pending_progress()
    assert seq == 2
    assert json.loads(body) == {"done": 4.5, "total": 10, "note": "x" * PROGRESS_NOTE_MAX}
    ctx.progress_delivered(seq)
    assert ctx.pending_progress() is None  # sent: the next beat carries nothing
    for bad in (-1, math.nan, math.inf, True, "3"):
        with pytest.raises(duetime.InvalidInput, match="progress"):
            ctx.progress(bad)
    with pytest.raises(duetime.InvalidInput, match="total"):
        ctx.progress(1, -2)
    with pytest.raises(duetime.InvalidInput, match="note"):
        ctx.progress(1, 2, 3)  # type: ignore[arg-type]


@pytest.mark.scripts
def test_the_heartbeat_never_writes_an_oversized_progress(lapp):
    """The heartbeat carries allow-oom: whatever a client sends, it writes no large value."""
    s = Scripted(lapp)
    run_id = longruns.report.enqueue(1, 2, None)
    s.claim("wA")
    assert s.heartbeat(run_id, "wA:1", json.dumps({"done": 1, "note": "x" * 5000})) == [1]
    assert s.field(run_id, "progress") is None and s.field(run_id, "heartbeat") is not None
