"""`raise duetime.Continue(delay=..., state=...)`: the same run id again, from that
checkpoint, without spending an attempt; its continuations counted and shown."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgpack
import pytest
from duetime.common.codec import pack_checkpoint
from duetime.common.errors import InvalidTime

import duetime
from tests.apps import longruns
from tests.integration.inproc import burst
from tests.integration.opkit import as_json, cli
from tests.workloads.longrun_kit import Scripted, lapp

__all__ = ["lapp"]
pytestmark = pytest.mark.scripts


def test_continue_reruns_the_same_id_with_its_state_and_the_attempt_unchanged(lapp):
    run_id = longruns.slices.enqueue(5)
    burst(lapp)
    run = lapp.get_run(run_id)
    assert run.state == "succeeded" and lapp.wait(run_id, timeout=5) == 5
    # one slice per claim, each starting from the state the previous one continued with
    assert longruns.seen[run_id] == [(1, fence, fence - 1) for fence in range(1, 7)]
    assert run.attempt == 1 and run.fence == 6 and run.continuations == 5
    assert [a.outcome for a in run.attempts] == ["continued"] * 5 + ["succeeded"]
    assert run.checkpoint_fence == 5  # the last Continue wrote it
    assert msgpack.unpackb(Scripted(lapp).field(run_id, "checkpoint")) == {"i": 5}


def test_continue_without_state_keeps_the_checkpoint_the_slice_wrote(lapp):
    run_id = longruns.slices.enqueue(3, keep=True)
    burst(lapp)
    assert lapp.wait(run_id, timeout=5) == 3
    assert [s[2] for s in longruns.seen[run_id]] == [0, 1, 2, 3]
    assert lapp.get_run(run_id).continuations == 3


def test_an_async_task_continues_from_its_own_acheckpoint(lapp):
    run_id = longruns.aslices.enqueue(4)
    burst(lapp)
    assert lapp.wait(run_id, timeout=5) == 4
    run = lapp.get_run(run_id)
    assert run.continuations == 4 and run.attempt == 1


def test_a_continue_with_a_delay_is_due_later_and_runs_when_due(lapp):
    run_id = longruns.slices.enqueue(1, pause="1h")
    burst(lapp)  # the first slice; the continuation is due in an hour: not run
    run = lapp.get_run(run_id)
    assert run.state == "scheduled" and run.continuations == 1 and run.attempt == 0
    p = lapp.keys.partition_of_run(run_id)
    r = Scripted(lapp).r
    sec, _ = r.time()
    due = r.zscore(lapp.keys.due(p, "default"), run_id)
    assert due is not None and due >= (sec + 3500) * 1000  # about now + 1 h
    Scripted(lapp).due_now(run_id)
    burst(lapp)
    assert lapp.wait(run_id, timeout=5) == 1
    assert lapp.get_run(run_id).attempt == 1


def test_continue_parses_its_delay_as_retry_does_and_checks_its_state():
    assert duetime.Continue(delay="90s").delay_ms == 90_000
    assert duetime.Continue(delay=timedelta(minutes=2)).delay_ms == 120_000
    assert duetime.Continue().delay_ms == 0 and duetime.Continue().state_bytes is None
    assert duetime.Continue(state={"a": 1}).state_bytes == pack_checkpoint({"a": 1})
    with pytest.raises(InvalidTime, match="Continue"):
        duetime.Continue(delay="soonish")
    with pytest.raises(duetime.CheckpointTooLarge, match="65,536-byte cap"):
        duetime.Continue(state=b"x" * 70_000)


def test_a_stale_continue_is_refused_and_changes_nothing(lapp):
    s = Scripted(lapp)
    run_id = longruns.slices.enqueue(9)
    [a] = s.claim("wA")
    s.expire_and_reap(run_id)
    [b] = s.claim("wB")
    assert (a.fence, b.fence) == (1, 2)
    assert s.continue_run(run_id, a.fence, state=pack_checkpoint({"i": 99})) == "stale"
    run = lapp.get_run(run_id)
    assert run.state == "running" and run.fence == 2 and run.continuations == 0
    assert run.checkpoint_size is None
    assert s.continue_run(run_id, b.fence, state=pack_checkpoint({"i": 1})) == "continued"
    run = lapp.get_run(run_id)
    assert run.state == "scheduled" and run.continuations == 1
    assert run.attempt == 1  # b's claim counted its attempt (a's expired); b's continue did not
    assert s.continue_run(run_id, b.fence) == "stale"  # sent again: the run moved on
    assert s.continue_run("nope", 1) == "missing"


def test_runs_show_reports_continuations_and_the_checkpoint(lapp, url, namespace):
    run_id = longruns.slices.enqueue(2, pause="1h")
    burst(lapp)
    d = as_json(cli(url, namespace, "runs", "show", run_id, "--json"))
    assert d["continuations"] == 1 and d["attempt"] == 0 and d["state"] == "scheduled"
    assert d["checkpoint"]["size_bytes"] == len(pack_checkpoint({"i": 1}))
    assert d["checkpoint"]["fence"] == 1 and d["checkpoint"]["age_s"] >= 0
    assert d["attempts"][0]["outcome"] == "continued"
    text = cli(url, namespace, "runs", "show", run_id).stdout
    assert "continuations     1" in text and "checkpoint" in text


def test_the_worker_counts_continued_reports(lapp):
    from duetime.common import metrics

    before = metrics.child(metrics.RUNS_FINISHED, "lr.slices", "continued")._value.get()
    run_id = longruns.slices.enqueue(2)
    asyncio.run(_drain(lapp))
    after = metrics.child(metrics.RUNS_FINISHED, "lr.slices", "continued")._value.get()
    assert after - before == 2 and lapp.get_run(run_id).state == "succeeded"


async def _drain(app):
    from tests.integration.inproc import drain

    await drain(app)
