"""A fault after a decided success is recorded on the attempt, not only logged: the
connection drops after complete.lua committed but before its reply came back; the worker
sends the report again, the script answers as before (the run is succeeded once) and the
attempt's entry says what the first send met."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from duetime.common.scripts import sha as script_sha

from tests.apps import basic
from tests.integration.inproc import serving, until


class _DropsReplyOnce:
    """A client whose first pipeline holding a complete.lua call is executed on the server,
    then its reply is lost (ConnectionError), as when a connection resets mid-reply."""

    def __init__(self, client: Any, complete_sha: str) -> None:
        self._client, self._sha, self.dropped = client, complete_sha, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._client.pipeline(*args, **kwargs)
        real = pipe.execute
        outer = self

        async def execute(*a: Any, **kw: Any) -> Any:
            calls = [c[0] for c in pipe.command_stack]
            res = await real(*a, **kw)
            if not outer.dropped and any(outer._sha in map(str, c) for c in calls):
                outer.dropped += 1
                raise redis.ConnectionError("Connection reset by peer (injected: reply lost)")
            return res

        pipe.execute = execute
        return pipe


def test_a_success_whose_reply_was_lost_records_the_fault_on_its_attempt(app):
    async def main() -> str:
        async with serving(app) as w:
            wrapper = _DropsReplyOnce(w.reporter.client, script_sha("complete"))
            w.reporter.client = wrapper  # type: ignore[assignment]
            run_id = app.enqueue(basic.noop, [1])
            await until(lambda: app.get_run(run_id).state == "succeeded", 30, what="success")
            await until(lambda: not w.reporter.pending(), 30, what="the report recorded")
            assert wrapper.dropped == 1
            return run_id

    run_id = asyncio.run(main())
    run = app.get_run(run_id)
    [attempt] = run.attempts
    assert attempt.outcome == "succeeded"
    assert attempt.report_fault and "ConnectionError" in attempt.report_fault, attempt
    assert "sent again" in attempt.report_fault
