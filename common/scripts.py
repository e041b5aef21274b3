"""The Lua scripts of `lua/`: one per state transition, assembled, loaded and called here.

Assembly. A script is its own file plus only the helpers of `lua/_lib.lua` it uses (found by
name, with the helpers those use), and `K.<kind>` key suffixes written in from
`common/keys.py` (the one place a suffix is spelled). An optional first line `#!lua flags=...`
stays first: Redis 7 then checks the script as a whole before it runs (a script without
`allow-oom` is refused at maxmemory before its first write, never halfway).

Errors. Redis and Valkey report a script's error at a line of the source they ran
(`user_script:3030`). Lines are laid out so that number alone says which file and line it is
(helpers keep their _lib.lua line numbers; script number i starts at line 500·i), and every
connection duetime opens rewrites it to what a developer opens (`claim.lua:30`), for direct
calls and pipelines alike, see `explain`.

Why EVALSHA scripts, not a Redis Functions library: every connection loads the scripts when it
opens (one pipelined round trip), so a restarted server or a promoted replica never meets a
missing script, and two versions of duetime running side by side in a rolling deploy each call
their own script versions (a FUNCTION LOAD REPLACE would swap one library under both).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
from duetime.common.keys import SUFFIX
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
    "partition_owners",
    "cancel",
    "replay",
    "resolve",
    "purge",
    "schedule_quarantine",
    "wait",
    "handback",
)
LIB = "_lib.lua"
_DEF = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")
_KEY = re.compile(r"\bK\.([a-z_]+)")
_AT = re.compile(r"(@?)user_script:(\d+)")
STRIDE = 500  # lines per script in the numbering of `assembled`


@dataclass(frozen=True)
class Helper:
    name: str
    lines: list[str]  # the definition with the comment lines just above it
    first: int  # its first line in _lib.lua (1-based)
    uses: frozenset[str]  # other helpers it calls


@dataclass(frozen=True)
class Assembled:
    name: str
    source: str
    sha: str


@cache
def _read(name: str) -> str:
    return (resources.files("duetime.lua") / name).read_text()


def _strip_comment(line: str) -> str:
    return line.split("--", 1)[0]


def _words(lines: list[str]) -> set[str]:
    return {w for line in lines for w in _WORD.findall(_strip_comment(line))}


@cache
def helpers(lib_text: str | None = None) -> dict[str, Helper]:
    """`_lib.lua` split into its top-level definitions (`local function f` / `local X =`),
    each with the comments right above it; a function ends at the first `end` in column 0, a
    value where its braces close."""
    lines = (_read(LIB) if lib_text is None else lib_text).splitlines()
    found: list[tuple[str, int, int, int]] = []  # name, comment start, def line, end (excl.)
    i, comment_start = 0, None
    while i < len(lines):
        line = lines[i]
        m = _DEF.match(line)
        if line.startswith("--"):
            comment_start = i if comment_start is None else comment_start
        elif m:
            end = i + 1
            if line.startswith("local function"):
                while not lines[end - 1].startswith("end"):
                    end += 1
            else:  # a value, maybe a table over several lines
                depth = line.count("{") - line.count("}")
                while depth > 0:
                    depth += lines[end].count("{") - lines[end].count("}")
                    end += 1
            found.append((m.group(1), i if comment_start is None else comment_start, i, end))
            i, comment_start = end, None
            continue
        else:
            comment_start = None
        i += 1
    names = {n for n, *_ in found}
    out = {}
    for name, start, def_line, end in found:
        body = lines[def_line:end]
        out[name] = Helper(name, lines[start:end], start + 1, frozenset((_words(body) & names) - {name}))
    return out


def _needed(body: list[str], lib_text: str | None = None) -> list[Helper]:
    """The helpers `body` uses, with the helpers they use, in _lib.lua's order."""
    lib = helpers(lib_text)
    todo, need = list(_words(body) & lib.keys()), set()
    while todo:
        n = todo.pop()
        if n not in need:
            need.add(n)
            todo += lib[n].uses
    return [h for h in lib.values() if h.name in need]


def _suffixes(text: str, where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in SUFFIX:
            raise ValueError(f"{where}: unknown key kind K.{m.group(1)} (see common/keys.py)")
        return repr(SUFFIX[m.group(1)])

    return _KEY.sub(sub, text)


# Resharding. While an operator moves a partition's slot to another node (CLUSTER SETSLOT
# MIGRATING/IMPORTING, then MIGRATE a few keys at a time), its keys are split between the two.
# Redis checks only a script's declared KEYS before it starts; a key the script builds from the
# partition prefix (a run hash, an attempt list, a run it creates) that is on the other node, or
# not created yet, stops the script with an error halfway, after its first writes; and on the
# new node, reached through ASK, a key not moved yet reads as missing (claim.lua drops a due
# run whose record has not come over yet: the run is then in no index). So every script first
# asks whether its slot is moving: two keys that never exist, in one call, are refused by the
# node giving the slot away (ASK) and by the node taking it (TRYAGAIN, under ASKING), answered
# (0) anywhere else. A moving slot gets a TRYAGAIN before any write: clients call again, and
# once the move ends the new node holds every key. Scripts whose first key has no partition tag
# touch only declared keys: Redis alone handles them. It sits on script line 1 (the `#!lua`
# line moved to the top) so that no other line moves; one EXISTS of two absent keys is its
# whole cost.
SLOT_GUARD = (
    "do local p = KEYS[1] and string.match(KEYS[1], '^[^{]*{[^}]+}:') if p then "
    "local r = redis.pcall('EXISTS', p .. '~moving:1', p .. '~moving:2') "
    "if type(r) == 'table' and r.err then "
    "if string.find(r.err, 'non local key', 1, true) or string.find(r.err, '^TRYAGAIN') "
    "or string.find(r.err, '^ASK') then "
    "return redis.error_reply('TRYAGAIN the partition is moving to another node: try again') "
    "end return r end end end"
)


def assemble(name: str, lib_text: str, body_text: str) -> str:
    """_lib.lua with the definitions this script does not use blanked out, padded with empty
    lines, then the script's own lines from line `STRIDE * (its index + 1) + 1`: every line of
    every script has a number of its own, so an error's line alone says where it is. The
    script's `#!lua` line goes first; its own line 1 becomes the SLOT_GUARD."""
    lib, body = lib_text.splitlines(), body_text.splitlines()
    if len(lib) >= STRIDE or len(body) >= STRIDE:
        raise ValueError(f"{LIB} and every script must stay under {STRIDE} lines")
    keep: set[int] = set()
    for h in _needed(body, lib_text):
        keep.update(range(h.first, h.first + len(h.lines)))
    head = [lib[i - 1] if i in keep else "" for i in range(1, len(lib) + 1)]
    if body and body[0].startswith("#!"):  # the flags line must be the first line
        head[0], body = body[0], [SLOT_GUARD, *body[1:]]
    padding = "\n" * (STRIDE * (SCRIPT_NAMES.index(name) + 1) - len(head))
    return (_suffixes("\n".join(head), LIB) + "\n" + padding
            + _suffixes("\n".join(body), f"{name}.lua") + "\n")


@cache
def assembled(name: str) -> Assembled:
    source = assemble(name, _read(LIB), _read(f"{name}.lua"))
    return Assembled(name, source, hashlib.sha1(source.encode()).hexdigest())


@cache
def plain(name: str) -> Assembled:
    """The script without its `#!lua` flags line (blank, so lines keep their numbers), for a
    server that does not read one: the in-memory backend of `duetime.testing`."""
    src = assembled(name).source
    if src.startswith("#!"):
        src = "\n" + src.split("\n", 1)[1]
    return Assembled(name, src, hashlib.sha1(src.encode()).hexdigest())


def source(name: str) -> str:
    return assembled(name).source


def sha(name: str) -> str:
    return assembled(name).sha


def locate(line: int) -> str:
    """`claim.lua:30` for a line of an assembled script (see `assembled`)."""
    index, offset = divmod(line, STRIDE)
    if index == 0 or offset == 0:
        return f"{LIB}:{line}" if index == 0 else f"{SCRIPT_NAMES[index - 1]}.lua:?"
    if index > len(SCRIPT_NAMES):
        return f"user_script:{line}"
    return f"{SCRIPT_NAMES[index - 1]}.lua:{offset}"


def explain(message: str) -> str:
    """A Redis error text with `user_script:N` turned into the file and line behind it."""
    return _AT.sub(lambda m: m.group(1) + locate(int(m.group(2))), message)


def explained(exc: redis.ResponseError) -> redis.ResponseError:
    """The same exception, its message explained (see `explain`)."""
    if exc.args and isinstance(exc.args[0], str) and "user_script:" in exc.args[0]:
        exc.args = (explain(exc.args[0]), *exc.args[1:])
    return exc


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
    def __init__(self, name: str, plain_source: bool = False) -> None:
        self.name = name
        self.sha = plain(name).sha if plain_source else sha(name)

    def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        if _lone_durable_write(client, self.sha):  # the WAIT must follow on the same connection
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            return _first(pipe.execute(raise_on_error=False))
        return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def _lone_durable_write(client: Any, sha: str) -> bool:
    """A state-changing script called on a durable client itself, not on a pipeline
    (common.durability)."""
    from duetime.common.durability import writes

    return (getattr(client, "duetime_durability", None) is not None
            and not hasattr(client, "duetime_sealer") and writes(sha))


def _first(results: list[Any]) -> Any:
    if isinstance(results[0], Exception):
        raise results[0]
    return results[0]


class _AsyncScript(_Script):
    async def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        if isinstance(client, AsyncPipeline | AsyncClusterPipeline):
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        if _lone_durable_write(client, self.sha):
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
            return _first(await pipe.execute(raise_on_error=False))
        return await client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


class Bound:
    """One script bound to the client its Scripts were made for: `(keys, args, client=None)`;
    `client=` sends it elsewhere (a pipeline). On an asyncio client the call returns an
    awaitable. The reply is what the server sent (decoded by common/transitions.py)."""

    __slots__ = ("script", "default", "sha")

    def __init__(self, script: _Script, default: Any) -> None:
        self.script, self.default, self.sha = script, default, script.sha

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        return self.script(keys, args, self.default if client is None else client)


class Scripts:
    """Attribute access to the scripts: `scripts.claim(keys=..., args=..., client=pipe)`;
    without `client=` the call goes to the client the Scripts were made for. The KEYS/ARGV
    lists come from common/transitions.py. One attribute per name of SCRIPT_NAMES, declared
    here so that a type checker sees them (tests/unit/test_scripts_typed.py keeps the two lists
    equal)."""

    enqueue: Bound
    claim: Bound
    heartbeat: Bound
    complete: Bound
    fail: Bound
    release: Bound
    reap: Bound
    materialize: Bound
    schedule_upsert: Bound
    schedule_pause: Bound
    schedule_delete: Bound
    partition_owners: Bound
    cancel: Bound
    replay: Bound
    resolve: Bound
    purge: Bound
    schedule_quarantine: Bound
    wait: Bound
    handback: Bound

    def __init__(self, client: Any) -> None:
        self.client = client
        is_async = hasattr(client, "aclose")
        plain_source = getattr(client, "duetime_plain_scripts", False)  # see common/memory.py
        for name in SCRIPT_NAMES:
            script = (_AsyncScript if is_async else _Script)(name, plain_source)
            setattr(self, name, Bound(script, client))
