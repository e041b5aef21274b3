"""The Lua scripts of `lua/` (one per state transition, with the shared `_lib.lua`
prepended), called by EVALSHA on a client or a pipeline, standalone or cluster.

Every connection loads all scripts when it is opened (see `load_on_connect`, one pipelined
round trip per connection), so an EVALSHA never meets an empty script cache after a restart
or failover, and pipelines need no `SCRIPT EXISTS` round trip before each execute (redis-py's
own Script helper sends one per pipeline, and refuses cluster pipelines).
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline

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
    lua = resources.files("duetime.lua")
    lib = (lua / "_lib.lua").read_text()
    body = (lua / f"{name}.lua").read_text()
    return f"{lib}\n{body}"


@cache
def sha(name: str) -> str:
    return hashlib.sha1(source(name).encode()).hexdigest()


def load_scripts(conn: Any) -> None:
    """Connect hook body (sync): SCRIPT LOAD every script, pipelined on the new connection."""
    for name in SCRIPT_NAMES:
        conn.send_command("SCRIPT", "LOAD", source(name))
    for _ in SCRIPT_NAMES:
        conn.read_response()


def connect_and_load(conn: Any) -> None:
    """`redis_connect_func` for plain connections: the usual handshake, then the scripts."""
    conn.on_connect()
    load_scripts(conn)


async def aconnect_and_load(conn: Any) -> None:
    await conn.on_connect()
    for name in SCRIPT_NAMES:
        await conn.send_command("SCRIPT", "LOAD", source(name))
    for _ in SCRIPT_NAMES:
        await conn.read_response()


class _Script:
    def __init__(self, name: str) -> None:
        self.name, self.sha = name, sha(name)

    def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


class _AsyncScript(_Script):
    async def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        if isinstance(client, AsyncPipeline | AsyncClusterPipeline):
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        return await client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def _bind(script: _Script, default: Any) -> Any:
    def call(keys: list[Any], args: list[Any], client: Any = None) -> Any:
        return script(keys, args, default if client is None else client)

    call.sha = script.sha  # type: ignore[attr-defined]
    return call


class Scripts:
    """Attribute access to the scripts: `scripts.claim(keys=..., args=..., client=pipe)`;
    without `client=` the call goes to the client the Scripts were made for."""

    def __init__(self, client: Any) -> None:
        self.client = client
        is_async = hasattr(client, "aclose")
        for name in SCRIPT_NAMES:
            setattr(self, name, _bind(_AsyncScript(name) if is_async else _Script(name), client))
