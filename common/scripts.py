"""Loads the Lua scripts of `lua/` (one per state transition) with the shared `_lib.lua`
prepended, and registers them on a client (EVALSHA with transparent reload).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "heartbeat",
    "complete",
    "fail",
    "release",
    "reap",
    "materialize",
    "schedule_upsert",
    "schedule_pause",
    "schedule_delete",
    "partition_lease",
    "cancel",
    "replay",
    "resolve",
    "purge",
)


@cache
def source(name: str) -> str:
    lua = resources.files("lua")
    lib = (lua / "_lib.lua").read_text()
    body = (lua / f"{name}.lua").read_text()
    return f"{lib}\n{body}"


class Scripts:
    """Attribute access to registered scripts: `scripts.claim(keys=..., args=...)`."""

    def __init__(self, client: Any) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, client.register_script(source(name)))

    enqueue: Any
    claim: Any
    heartbeat: Any
    complete: Any
    fail: Any
    release: Any
    reap: Any
    materialize: Any
    schedule_upsert: Any
    schedule_pause: Any
    schedule_delete: Any
    partition_lease: Any
    cancel: Any
    replay: Any
    resolve: Any
    purge: Any
