"""No exception inside the worker is ever lost: a fault injected at each step of the
execute/report path (in-process, against a real server) is logged with the run id, and the
run still ends with its outcome recorded (the fault on the attempt where it decided it), never
left running until its lease lapses with "lease expired" as its only trace."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from duetime.common import codec
from duetime.common import transitions as tr
from duetime.worker import execution, reporter
from duetime.worker.execution import Executor
from duetime.worker.reporter import Reporter

from duetime import App, ResultNotStored
from tests.integration.inproc import serving, until
from tests.recorder import Recorder


class Injected(RuntimeError):
    pass


def once(real: Any, where: str, is_async: bool = False) -> Any:
    """`real`, raising Injected the first time it is called."""
    def fault() -> None:
        state = wrapper.state
        if not state["raised"]:
            state["raised"] = True
            raise Injected(f"injected at {where}")

    if is_async:
        async def wrapper(*a: Any, **kw: Any) -> Any:
            fault()
            return await real(*a, **kw)
    else:
        def wrapper(*a: Any, **kw: Any) -> Any:
            fault()
            return real(*a, **kw)
    wrapper.state = {"raised": False}  # type: ignore[attr-defined]
    return wrapper


# where, (object, attribute, async), what the run shows afterwards
POINTS = {
    # the step where the executor hands the attempt to its body (Executor._enter_body: an
    # async body is awaited inline in _attempt, a sync one through _call; both enter here)
    "executor call": (Executor, "_enter_body", False, "retried"),
    "result packing": (execution, "pack_result", False, "not stored"),
    "attempt counting": (Executor, "count_successes", False, "succeeded"),
    "hand-over to the reporter": (Reporter, "complete", False, "retried"),
    "report building": (tr, "complete", False, "succeeded"),
    "report script call": ("scripts", "complete", True, "succeeded"),
    "reply counting": (reporter, "child", False, "succeeded"),
}


def inject(monkeypatch: pytest.MonkeyPatch, target: Any, attr: str, where: str,
           is_async: bool) -> dict[str, bool]:
    """Patch `target.attr` to raise once; "scripts" is the reporter's own Scripts (made per
    worker, so patched as each reporter is made)."""
    if target != "scripts":
        fault = once(getattr(target, attr), where, is_async)
        monkeypatch.setattr(target, attr, fault)
        return fault.state  # type: ignore[no-any-return]
    state = {"raised": False}
    real_init = Reporter.__init__

    def init(self: Reporter, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        fault = once(getattr(self.scripts, attr), where, is_async)
        fault.state = state
        setattr(self.scripts, attr, fault)
    monkeypatch.setattr(Reporter, "__init__", init)
    return state


def _logged(rec: Recorder, run_id: str, where: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [(lvl, e, kw) for lvl, e, kw in rec.lines
            if where in str(kw.get("error", "")) + str(kw.get("why", ""))
            and (kw.get("run_id") == run_id or run_id in kw.get("runs", []))]


@pytest.mark.parametrize("where", list(POINTS))
def test_a_fault_at_each_step_is_logged_with_the_run_id_and_recorded(url, namespace,
                                                                     monkeypatch, where):
    target, attr, is_async, shows = POINTS[where]
    rec = Recorder()
    monkeypatch.setattr(execution, "log", rec)
    monkeypatch.setattr(reporter, "log", rec)
    fault = inject(monkeypatch, target, attr, where, is_async)
    app = App(redis_url=url, namespace=namespace)

    @app.task(name="adds", retries=2, backoff=(0, 0))
    async def adds(a: int, b: int) -> int:
        return a + b

    async def main() -> str:
        run_id = app.enqueue(adds, [2, 3])
        async with serving(app, lease_ms=60_000):  # a lapsed lease is not how it ends here
            await until(lambda: app.get_run(run_id).state == "succeeded", 30,
                        what=f"the run to succeed despite a fault at {where}")
        return run_id

    try:
        run_id = asyncio.run(main())
        run = app.get_run(run_id)
    finally:
        app.close()
    assert fault["raised"], "the fault was never reached"
    assert _logged(rec, run_id, f"injected at {where}"), rec.lines
    if shows == "retried":  # decided before its outcome was handed over: on the attempt
        assert len(run.attempts) == 2, run.attempts
        assert f"injected at {where}" in (run.attempts[0].error or "")
        assert app.wait(run_id, 5) == 5
    elif shows == "not stored":
        assert len(run.attempts) == 1
        with pytest.raises(ResultNotStored, match=f"injected at {where}"):
            app.wait(run_id, 5)
    else:  # after the outcome was decided: it stands, once
        assert len(run.attempts) == 1
        assert app.wait(run_id, 5) == 5


@pytest.mark.parametrize("where, target, attr, is_async", [
    ("failure report building", tr, "fail", False),
    ("failure report script call", "scripts", "fail", True),
])
def test_a_fault_while_reporting_a_failure_still_records_it(url, namespace, monkeypatch, where,
                                                             target, attr, is_async):
    rec = Recorder()
    monkeypatch.setattr(reporter, "log", rec)
    fault = inject(monkeypatch, target, attr, where, is_async)
    app = App(redis_url=url, namespace=namespace)

    @app.task(name="breaks", retries=0)
    async def breaks() -> None:
        raise ValueError("the task's own error")

    async def main() -> str:
        run_id = app.enqueue(breaks)
        async with serving(app, lease_ms=60_000):
            await until(lambda: app.get_run(run_id).state == "dead", 30, what="a dead letter")
        return run_id

    try:
        run = app.get_run(asyncio.run(main()))
    finally:
        app.close()
    assert fault["raised"]
    assert _logged(rec, run.id, f"injected at {where}"), rec.lines
    assert "the task's own error" in (run.attempts[0].error or "")
    assert "lease expired" not in (run.error or "") + (run.reason or "")


def test_results_still_pack_after_a_failed_pack():
    """A failed pack must not leave a partial buffer that prefixes the next result."""
    with pytest.raises(codec.InvalidInput):
        codec.pack_result([1, 2, object()])
    assert codec.unpack_result(codec.pack_result([3])) == [3]
