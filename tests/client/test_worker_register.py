"""A worker's start-up writes (queue names, published task options) outlive a server that goes
away between the start-up probe and them: retried once it answers again, not an exit."""

from __future__ import annotations

from typing import Any

import redis

import duetime
from duetime.cli.worker import register


class FlakyPublish:
    """An App whose publish_tasks fails with a lost connection `failures` times."""

    def __init__(self, app: duetime.App, failures: int) -> None:
        self.app, self.failures, self.calls = app, failures, 0
        self.store, self.keys = app.store, app.keys

    def publish_tasks(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return self.app.publish_tasks()


def test_start_up_writes_are_retried_after_the_server_comes_back(app: duetime.App):
    flaky = FlakyPublish(app, failures=2)
    waited: list[int] = []
    register(flaky, ["default", "q2"], wait=lambda: waited.append(1))  # type: ignore[arg-type]
    assert flaky.calls == 3 and len(waited) == 2  # waited for the server before each retry
    assert app.store.client.smembers(app.keys.queues) >= {b"default", b"q2"}
