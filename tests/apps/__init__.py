"""The tests' applications. Each module has its own `App` and, for its tasks' records, its own
Redis client: `r = OwnClient(app)`, then `r()` in a task."""

from __future__ import annotations

from typing import Any

import redis
from duetime.common.connection import sync_client


class OwnClient:
    """A task module's client, one per URL its app is configured with (a test suite moves the
    app between servers: Redis, Valkey, a cluster), made on first use in the process that runs
    the task. `clear()` forgets them (a test that restarted the server: their connections are
    to the old process)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.by_url: dict[str, redis.Redis] = {}

    def __call__(self) -> redis.Redis:
        url = self.app.redis_url
        if url not in self.by_url:
            self.by_url[url] = sync_client(url)  # standalone or cluster
        return self.by_url[url]

    def clear(self) -> None:
        self.by_url.clear()
