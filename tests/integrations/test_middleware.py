"""Middleware (common/middleware.py, worker/middleware.py): the hooks' order and run context,
sync and async, what a raising hook changes (nothing, but a before_attempt: that attempt
fails), headers carried from the enqueue to every attempt, on_dead and on_uncertain from the
worker's own reports. In-process workers on a real server, and on the in-memory backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from duetime.common import middleware as common_mw
from duetime.common.middleware import EnqueueInfo, RunInfo

import duetime
from tests.integration.inproc import drain, serving
from tests.recorder import Recorder

pytestmark = pytest.mark.scripts


def due_now(app: duetime.App, run_id: str) -> None:
    """A retry due at the server's now (instead of sleeping through its backoff)."""
    r, k = app.store.ready(), app.keys
    p = k.partition_of_run(run_id)
    sec, usec = r.time()
    assert r.zadd(k.retry(p, "default"), {run_id: sec * 1000 + usec // 1000}, xx=True, ch=True)


class Log:
    """Records every hook call as (middleware name, hook, what it saw)."""

    def __init__(self, name: str, calls: list[tuple[str, str, Any]]) -> None:
        self.name, self.calls = name, calls

    def on_enqueue(self, request: EnqueueInfo) -> None:
        request.headers[f"by-{self.name}"] = request.run_id
        self.calls.append((self.name, "on_enqueue", request.run_id))

    def after_enqueue(self, request: EnqueueInfo, error: BaseException | None) -> None:
        self.calls.append((self.name, "after_enqueue", (request.run_id, error)))

    def before_attempt(self, run: RunInfo) -> None:
        self.calls.append((self.name, "before_attempt", run))

    def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
        self.calls.append((self.name, "after_attempt", (run.attempt, outcome, error)))

    def on_dead(self, run: RunInfo) -> None:
        self.calls.append((self.name, "on_dead", (run.attempt, run.error)))


def test_hooks_run_in_registration_order_with_the_run_context(own_app: duetime.App):
    calls: list[tuple[str, str, Any]] = []
    own_app.middleware(Log("a", calls))
    own_app.middleware(Log("b", calls))
    seen: list[Any] = []

    @own_app.task(name="mw.ctx", queue="q1", owner="team-x", tenant="acme")
    def ctx_task(x: int) -> int:
        seen.append(duetime.current_run().run_id)
        return x * 2

    run_id = ctx_task.options(key="k1").enqueue(21)
    asyncio.run(drain(own_app, queues=["q1"]))
    assert own_app.wait(run_id, 30) == 42 and seen == [run_id]
    assert [(n, h) for n, h, _ in calls] == [
        ("a", "on_enqueue"), ("b", "on_enqueue"), ("a", "after_enqueue"), ("b", "after_enqueue"),
        ("a", "before_attempt"), ("b", "before_attempt"), ("a", "after_attempt"),
        ("b", "after_attempt")]
    assert calls[0][2] == run_id  # the id is fixed before the write: the one enqueue returns
    assert calls[2][2] == (run_id, None)
    run = calls[4][2]
    assert (run.run_id, run.task, run.queue, run.attempt, run.schedule, run.tenant, run.owner) \
        == (run_id, "mw.ctx", "q1", 1, None, "acme", "team-x")
    assert list(run.args) == [21] and run.idempotency_key == "k1"
    # the headers on_enqueue added were stored on the run and claimed with it
    assert dict(run.headers) == {"by-a": run_id, "by-b": run_id}
    assert calls[6][2] == (1, "succeeded", None)
    # and `runs show --json` shows them
    from duetime.ops.render import run_to_dict

    assert run_to_dict(own_app.get_run(run_id))["headers"] == {"by-a": run_id, "by-b": run_id}


def test_async_hooks_and_aenqueue(own_app: duetime.App):
    order: list[str] = []

    class Async(duetime.Middleware):
        async def on_enqueue(self, request: EnqueueInfo) -> None:
            await asyncio.sleep(0)
            request.headers["h"] = "1"
            order.append("on_enqueue")

        async def before_attempt(self, run: RunInfo) -> None:
            await asyncio.sleep(0)
            order.append(f"before {run.headers.get('h')}")

        async def after_attempt(self, run: RunInfo, outcome: str,
                                error: BaseException | None) -> None:
            await asyncio.sleep(0)
            order.append(f"after {outcome}")

    own_app.middleware(Async())

    @own_app.task(name="mw.async")
    async def atask() -> str:
        order.append("body")
        return "ok"

    async def main() -> str:
        run_id = await atask.aenqueue()
        await drain(own_app)
        return str(await own_app.await_result(run_id, 30))

    assert asyncio.run(main()) == "ok"
    assert order == ["on_enqueue", "before 1", "body", "after succeeded"]
    # the sync enqueue runs an async on_enqueue too (on a loop of its own)
    atask.enqueue()
    assert order[-1] == "on_enqueue"


def test_failed_attempts_are_numbered_and_on_dead_follows_the_last(own_app: duetime.App):
    calls: list[tuple[str, str, Any]] = []
    own_app.middleware(Log("a", calls))

    @own_app.task(name="mw.fails", retries=1, backoff=(0, 0))
    def fails() -> None:
        raise ValueError("boom")

    run_id = fails.enqueue()
    asyncio.run(drain(own_app))
    ends = [(h, v) for _, h, v in calls if h in ("after_attempt", "on_dead")]
    assert [h for h, _ in ends] == ["after_attempt", "after_attempt", "on_dead"]
    for n, (_, (attempt, outcome, error)) in enumerate(ends[:2], start=1):
        assert (attempt, outcome, type(error), str(error)) == (n, "failed", ValueError, "boom")
    assert ends[2][1][0] == 2 and "boom" in ends[2][1][1]
    assert own_app.get_run(run_id).state == "dead"


def test_a_raising_hook_is_logged_with_the_run_id_and_changes_nothing(
        own_app: duetime.App, monkeypatch: pytest.MonkeyPatch):
    rec = Recorder()
    monkeypatch.setattr(common_mw, "log", rec)

    class Broken:
        def on_enqueue(self, request: EnqueueInfo) -> None:
            raise RuntimeError("enqueue hook broke")

        def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
            raise RuntimeError("after hook broke")

        def on_dead(self, run: RunInfo) -> None:
            raise RuntimeError("dead hook broke")

    calls: list[tuple[str, str, Any]] = []
    own_app.middleware(Broken())
    own_app.middleware(Log("after-broken", calls))  # the chain goes on past a raising hook

    @own_app.task(name="mw.ok")
    def ok() -> int:
        return 7

    @own_app.task(name="mw.fatal")
    def fatal() -> None:
        raise duetime.Fatal("no retry")

    ok_id, fatal_id = ok.enqueue(), fatal.enqueue()
    asyncio.run(drain(own_app))
    assert own_app.wait(ok_id, 30) == 7
    assert own_app.get_run(fatal_id).state == "dead"
    failures = {(e["hook"], e["run_id"]) for e in rec.events("middleware hook failed")}
    assert failures == {("on_enqueue", ok_id), ("on_enqueue", fatal_id),
                        ("after_attempt", ok_id), ("after_attempt", fatal_id),
                        ("on_dead", fatal_id)}
    assert all(e["middleware"].endswith("Broken") and "broke" in e["error"]
               for e in rec.events("middleware hook failed"))
    assert ("after-broken", "on_dead", (1, "Fatal: no retry")) in [
        (n, h, (v[0], v[1].split("\n")[0]) if h == "on_dead" else v) for n, h, v in calls]


def test_a_before_attempt_that_raises_fails_that_attempt_with_its_error(own_app: duetime.App):
    state = {"refuse": True, "ran": 0}
    outcomes: list[tuple[int, str, str]] = []

    class Gatekeeper(duetime.Middleware):
        def before_attempt(self, run: RunInfo) -> None:
            if state["refuse"]:
                raise PermissionError("not now")

        def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
            outcomes.append((run.attempt, outcome, repr(error)))

    own_app.middleware(Gatekeeper())

    @own_app.task(name="mw.gated", retries=2)
    def gated() -> str:
        state["ran"] += 1
        return "done"

    run_id = gated.enqueue()
    asyncio.run(drain(own_app))
    run = own_app.get_run(run_id)
    assert run.state == "retrying" and state["ran"] == 0  # the body did not run
    assert "PermissionError: not now" in (run.attempts[0].error or "")
    assert outcomes == [(1, "failed", "PermissionError('not now')")]
    state["refuse"] = False
    due_now(own_app, run_id)
    asyncio.run(drain(own_app))
    assert own_app.wait(run_id, 30) == "done" and state["ran"] == 1
    assert outcomes[1] == (2, "succeeded", "None")


def test_headers_out_of_bounds_are_dropped_and_said(own_app: duetime.App,
                                                     monkeypatch: pytest.MonkeyPatch):
    from duetime import app as app_module

    rec = Recorder()
    monkeypatch.setattr(app_module, "log", rec)
    seen: list[dict[str, str]] = []

    class Big(duetime.Middleware):
        def on_enqueue(self, request: EnqueueInfo) -> None:
            request.headers["big"] = "x" * 5000

        def before_attempt(self, run: RunInfo) -> None:
            seen.append(dict(run.headers))

    own_app.middleware(Big())

    @own_app.task(name="mw.big")
    def big() -> int:
        return 1

    run_id = big.enqueue()
    asyncio.run(drain(own_app))
    assert own_app.wait(run_id, 30) == 1 and seen == [{}]
    [said] = rec.events("middleware left headers that cannot be stored; the run is enqueued "
                        "without them")
    assert said["run_id"] == run_id and "2048" in said["error"]


def test_enqueue_many_and_the_decorator_form(own_app: duetime.App):
    got: list[str] = []

    @own_app.middleware
    class Ids(duetime.Middleware):
        def on_enqueue(self, request: EnqueueInfo) -> None:
            got.append(request.run_id)

    assert isinstance(Ids, type)

    @own_app.task(name="mw.many", tenant="t1")
    def many(i: int) -> int:
        return i

    ids = own_app.enqueue_many([(many, [i]) for i in range(5)] + [
        {"task": many, "args": [9], "key": "same"}, {"task": many, "args": [9], "key": "same"}])
    assert got == ids and ids[5] == ids[6]
    # the ids are those the store chooses without middleware too: in the tenant's partition
    p = own_app.keys.partition_of_tenant("t1")
    assert {own_app.keys.partition_of_run(i) for i in ids} == {p}


def test_an_object_without_hooks_is_refused(own_app: duetime.App):
    class Typo:
        def before_atempt(self, run: RunInfo) -> None: ...

    with pytest.raises(duetime.InvalidInput, match="has none of the hooks"):
        own_app.middleware(Typo())


def test_a_worker_without_middleware_runs_none_of_it(own_app: duetime.App):
    from duetime.worker.runtime import Worker, WorkerConfig

    worker = Worker(own_app.registry, own_app.redis_url, own_app.keys, WorkerConfig(queues=["default"]))
    assert worker.executor.hooks is None and worker.reporter.on_ended is None

    class OnlyEnqueue(duetime.Middleware):  # a producer's middleware: still nothing in workers
        def on_enqueue(self, request: EnqueueInfo) -> None: ...

    own_app.middleware(OnlyEnqueue())
    worker2 = Worker(own_app.registry, own_app.redis_url, own_app.keys, WorkerConfig(queues=["default"]))
    assert worker2.executor.hooks is None
    asyncio.run(worker.client.aclose())
    asyncio.run(worker2.client.aclose())


@pytest.mark.scripts(memory="a worker shut down mid-run: release.lua on real servers")
def test_on_uncertain_when_shutdown_cuts_off_a_non_idempotent_run(own_app: duetime.App):
    events: list[tuple[str, Any]] = []

    class Watch(duetime.Middleware):
        def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
            events.append(("after_attempt", outcome))

        def on_uncertain(self, run: RunInfo) -> None:
            events.append(("on_uncertain", (run.run_id, run.error)))

    own_app.middleware(Watch())
    started = asyncio.Event()

    @own_app.task(name="mw.cutoff", idempotent=False)
    async def cutoff() -> None:
        started.set()
        await asyncio.Event().wait()  # until the worker gives it back

    async def main() -> str:
        run_id = await cutoff.aenqueue()
        async with serving(own_app, grace_s=0.0):
            await asyncio.wait_for(started.wait(), 30)
        return run_id

    run_id = asyncio.run(main())
    assert own_app.get_run(run_id).state == "uncertain"
    assert events[0] == ("after_attempt", "released")
    assert events[1][0] == "on_uncertain" and events[1][1][0] == run_id
    assert "not idempotent" in events[1][1][1]


def test_a_timeout_is_a_failed_attempt_with_a_timeout_error(own_app: duetime.App):
    got: list[tuple[str, str]] = []

    class Watch(duetime.Middleware):
        def after_attempt(self, run: RunInfo, outcome: str, error: BaseException | None) -> None:
            got.append((outcome, type(error).__name__))

    own_app.middleware(Watch())

    @own_app.task(name="mw.slow", timeout=0.05, retries=0)
    async def slow() -> None:
        await asyncio.Event().wait()

    run_id = slow.enqueue()
    asyncio.run(drain(own_app))
    assert own_app.get_run(run_id).state == "dead"
    assert got == [("failed", "TimeoutError")]


def test_a_run_refused_before_its_body_reaches_on_dead_only(own_app: duetime.App):
    calls: list[tuple[str, str, Any]] = []
    own_app.middleware(Log("a", calls))

    @own_app.task(name="mw.unreadable")
    def unreadable() -> None:
        pass

    run_id = unreadable.enqueue()
    r, k = own_app.store.ready(), own_app.keys
    r.hset(k.run(k.partition_of_run(run_id), run_id), "payload", b"\xc1 not msgpack")
    asyncio.run(drain(own_app))
    assert own_app.get_run(run_id).state == "dead"
    hooks = [h for _, h, _ in calls]
    assert hooks == ["on_enqueue", "after_enqueue", "on_dead"]  # no before/after: no body ran
    assert "payload unreadable" in calls[-1][2][1]
