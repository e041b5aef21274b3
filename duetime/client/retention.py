"""Retention by state as operators set it (`duetime retention set|show`): the namespace's
`<ns>:retention` hash, which the reapers copy into every partition (common/retention.py)."""

from __future__ import annotations

import json
from typing import Any

import redis

from duetime.common.connection import translated
from duetime.common.errors import InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.names import check_name
from duetime.common.retention import STATES, defaults, table

SCOPES = ("namespace", "queue", "task")


def scope_field(scope: str, name: str | None) -> str:
    if scope not in SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(SCOPES)}; got {scope!r}")
    if scope == "namespace":
        return "*"
    check_name(scope, name)
    return f"{scope}:{name}"


class RetentionStore:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def set(self, scope: str, name: str | None, by_state: dict[str, int]) -> dict[str, int]:
        """Merge {state: ms (0 = never)} into one scope; → the scope's table now."""
        field = scope_field(scope, name)
        for s in by_state:
            if s not in STATES:
                raise InvalidInput(f"unknown state {s!r}; the states: {', '.join(STATES)}")
        with translated(self.url):
            raw = self.client.hget(self.keys.retention_config, field)
            cur = self._decode(raw)
            cur.update(by_state)
            self.client.hset(self.keys.retention_config, field, json.dumps(cur, sort_keys=True))
        return cur

    def clear(self, scope: str, name: str | None) -> bool:
        with translated(self.url):
            return bool(self.client.hdel(self.keys.retention_config, scope_field(scope, name)))

    @staticmethod
    def _decode(raw: bytes | str | None) -> dict[str, int]:
        try:
            d = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return {k: int(v) for k, v in d.items() if k in STATES} if isinstance(d, dict) else {}

    def show(self, short_ms: int = 24 * 3600 * 1000) -> dict[str, Any]:
        """The built-in defaults (with the reaper's default --retention), every override set
        and the table the reapers apply (task options included)."""
        with translated(self.url):
            config = self.client.hgetall(self.keys.retention_config)
            tasks = self.client.hgetall(self.keys.tasks)
        overrides = {(k.decode(errors="replace") if isinstance(k, bytes) else k): self._decode(v)
                     for k, v in sorted(config.items())}
        return {"defaults": defaults(short_ms), "set": overrides,
                "effective": dict(sorted(table(config, tasks).items()))}
