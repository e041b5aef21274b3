"""The Lua scripts of `lua/`: one per state transition, assembled, loaded and called here.

Assembly. A script is its own file, plus the step files it names on `-- @include <file>` lines
(whole, in that order: `lua/claim/*.lua`, see claim.lua), plus only the helpers of
`lua/_lib.lua` that any of those use (found by name, with the helpers those use), and
`K.<kind>` key suffixes written in from `common/keys.py` (the one place a suffix is spelled).
An included file holds only definitions (`local function`, `local NAME =`), each defined
before anything uses it; the assembler refuses anything else. An optional first line
`#!lua flags=...` stays first: Redis 7 then checks the script as a whole before it runs (a
script without `allow-oom` is refused at maxmemory before its first write, never halfway).

Errors. Redis and Valkey report a script's error at a line of the source they ran
(`user_script:3030`). Every file of `lua/` has its own range of line numbers in one layout
(`layout`: _lib.lua first, then each script in SCRIPT_NAMES order, its step files just before
it), and an assembled script puts each line it carries at that number (blank lines between),
so the number alone says which file and line it is, whatever the size of the files; every
connection duetime opens rewrites it to what a developer opens (`claim.lua:30`,
`claim/lanes.lua:12`), for direct calls and pipelines alike, see `explain`.

Why EVALSHA scripts, not a Redis Functions library: every connection loads the scripts when it
opens (one pipelined round trip), so a restarted server or a promoted replica never meets a
missing script, and two versions of duetime running side by side in a rolling deploy each call
their own script versions (a FUNCTION LOAD REPLACE would swap one library under both).
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
from duetime.common.keys import GLOBAL, SUFFIX
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
    "rate_limited",
    "checkpoint",
    "continue_run",
    "hold",
    "deps_link",
    "deps_apply",
    "batch_cancel",
    "deps_done",
)
LIB = "_lib.lua"
_DEF = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")
_KEY = re.compile(r"\bK\.([a-z_]+)")
_GLOBAL = re.compile(r"\bG\.([a-z_]+)")  # a namespace-wide suffix: `<ns>:` .. G.wake
_AT = re.compile(r"(@?)user_script:(\d+)")
_INCLUDE = re.compile(r"^-- @include (\S+\.lua)\s*$")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_NAME = re.compile(r"(?<![.:\w])[A-Za-z_]\w*")  # a name, not a field (`c.name`, `o:name`)

Reader = Callable[[str], str]  # a file of lua/ by its path there ('_lib.lua', 'claim/lanes.lua')


@dataclass(frozen=True)
class Helper:
    name: str
    lines: list[str]  # the definition with the comment lines just above it
    first: int  # its first line in its file (1-based)
    uses: frozenset[str]  # other helpers it calls


@dataclass(frozen=True)
class Assembled:
    name: str
    source: str
    sha: str


@dataclass(frozen=True)
class Span:
    """A file's place in the numbering of the assembled scripts: its line n is line
    `first + n - 1` of every script that carries it."""

    file: str  # as under lua/: 'claim.lua', 'claim/lanes.lua', '_lib.lua'
    first: int
    count: int


@cache
def _read(name: str) -> str:
    return (resources.files("duetime.lua") / name).read_text()


def _strip_comment(line: str) -> str:
    return line.split("--", 1)[0]


def _words(lines: list[str]) -> set[str]:
    return {w for line in lines for w in _WORD.findall(_strip_comment(line))}


def _names(lines: list[str]) -> set[str]:
    """The names `lines` refer to as variables: comments, strings and fields left out."""
    return {w for line in lines for w in _NAME.findall(_STRING.sub("''", _strip_comment(line)))}


def _definitions(lines: list[str], where: str = LIB, strict: bool = False
                 ) -> list[tuple[str, int, int, int]]:
    """(name, comment start, def line, end exclusive), 0-based, of the top-level definitions
    (`local function f` ending at the first `end` in column 0, or `local X =` ending where its
    braces close). `strict`: any other line that is not blank or a comment is an error (a step
    file holds definitions only: it runs before the script's slot check)."""
    found: list[tuple[str, int, int, int]] = []
    i, comment_start = 0, None
    while i < len(lines):
        line = lines[i]
        m = _DEF.match(line)
        if line.startswith("--"):
            comment_start = i if comment_start is None else comment_start
        elif m:
            end = i + 1
            if line.startswith("local function"):
                while end <= len(lines) and not lines[end - 1].startswith("end"):
                    end += 1
                if end > len(lines):
                    raise ValueError(f"{where}:{i + 1}: `{m.group(1)}` has no `end` in column 0")
            else:  # a value, maybe a table over several lines
                depth = line.count("{") - line.count("}")
                while depth > 0:
                    depth += lines[end].count("{") - lines[end].count("}")
                    end += 1
            found.append((m.group(1), i if comment_start is None else comment_start, i, end))
            i, comment_start = end, None
            continue
        else:
            if strict and line.strip():
                raise ValueError(f"{where}:{i + 1}: a step file holds only definitions "
                                 f"(`local function` / `local NAME =`): {line.strip()!r}")
            comment_start = None
        i += 1
    return found


@cache
def helpers(lib_text: str | None = None) -> dict[str, Helper]:
    """`_lib.lua` split into its top-level definitions (`local function f` / `local X =`),
    each with the comments right above it; a function ends at the first `end` in column 0, a
    value where its braces close."""
    lines = (_read(LIB) if lib_text is None else lib_text).splitlines()
    found = _definitions(lines)
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


def includes(body_text: str) -> list[str]:
    """The step files a script names on its `-- @include <file>` lines, in order."""
    return [m.group(1) for line in body_text.splitlines() if (m := _INCLUDE.match(line))]


def _check_order(files: list[tuple[str, list[str]]]) -> None:
    """Every definition of the step files comes before its first use: in Lua, a name used
    above its `local function` is a global, nil when the script runs."""
    defs = [(where, name, lines[d:end])
            for where, lines in files for name, _, d, end in _definitions(lines, where, strict=True)]
    for k, (where, name, _) in enumerate(defs):
        for other, user, body in defs[:k]:
            if name in _names(body):
                raise ValueError(f"{other}: `{user}` uses `{name}`, defined after it in {where}")


def _suffixes(text: str, where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in SUFFIX:
            raise ValueError(f"{where}: unknown key kind K.{m.group(1)} (see common/keys.py)")
        return repr(SUFFIX[m.group(1)])

    def sub_global(m: re.Match[str]) -> str:
        if m.group(1) not in GLOBAL:
            raise ValueError(f"{where}: unknown global key G.{m.group(1)} (see common/keys.py)")
        return repr(GLOBAL[m.group(1)])

    return _GLOBAL.sub(sub_global, _KEY.sub(sub, text))


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
# touch only declared keys: Redis alone handles them. It sits on the script's own line 1 (the
# `#!lua` line moved to the top) so that no other line moves, after the helpers' and steps'
# definitions (which call nothing); one EXISTS of two absent keys is its whole cost.
SLOT_GUARD = (
    "do local p = KEYS[1] and string.match(KEYS[1], '^[^{]*{[^}]+}:') if p then "
    "local r = redis.pcall('EXISTS', p .. '~moving:1', p .. '~moving:2') "
    "if type(r) == 'table' and r.err then "
    "if string.find(r.err, 'non local key', 1, true) or string.find(r.err, '^TRYAGAIN') "
    "or string.find(r.err, '^ASK') then "
    "return redis.error_reply('TRYAGAIN the partition is moving to another node: try again') "
    "end return r end end end"
)


def _layout(read: Reader) -> tuple[Span, ...]:
    spans: list[Span] = []
    at = 1
    for file in [LIB] + [f for name in SCRIPT_NAMES
                         for f in [*includes(read(f"{name}.lua")), f"{name}.lua"]]:
        if any(s.file == file for s in spans):
            continue  # a step file shared by two scripts keeps its first place
        count = len(read(file).splitlines())
        spans.append(Span(file, at, count))
        at += count + 1  # one blank line between files: no line belongs to two
    return tuple(spans)


@cache
def layout() -> tuple[Span, ...]:
    """Where each file of lua/ sits in the numbering every assembled script shares."""
    return _layout(_read)


def assemble(name: str, read: Reader = _read) -> str:
    """Script `name` as sent to the server: the lines of each file it carries (the _lib.lua
    helpers it needs, its step files, its own lines) at their numbers in `layout`, blank lines
    between; its `#!lua` line goes first, its own line 1 becomes the SLOT_GUARD. `read` gives
    the files (a copy of lua/ for a benchmark)."""
    spans = {s.file: s for s in _layout(read)}
    own_file = f"{name}.lua"
    body_text, lib_text = read(own_file), read(LIB)
    steps = [(f, read(f).splitlines()) for f in includes(body_text)]
    if [spans[f].first for f, _ in steps] != sorted(spans[f].first for f, _ in steps):
        raise ValueError(f"{own_file}: its @include lines are in another order than a script "
                         "before it includes the same files in")
    _check_order(steps)
    body = body_text.splitlines()
    lib = lib_text.splitlines()
    used = body + [line for _, lines in steps for line in lines]
    out = [""] * (spans[own_file].first + len(body) - 1)
    for h in _needed(used, lib_text):
        if h.first == 1:
            raise ValueError(f"{LIB}: line 1 is the script's flags line: keep a comment there")
        for n in range(h.first, h.first + len(h.lines)):
            out[n - 1] = _suffixes(lib[n - 1], LIB)
    for f, lines in [*steps, (own_file, body)]:
        base = spans[f].first - 1
        for n, line in enumerate(lines):
            out[base + n] = _suffixes(line, f)
    if body and body[0].startswith("#!"):  # the flags line must be the first line
        out[0], out[spans[own_file].first - 1] = body[0], SLOT_GUARD
    return "\n".join(out) + "\n"


@cache
def assembled(name: str) -> Assembled:
    source = assemble(name)
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
    """`claim.lua:30` (or `claim/lanes.lua:12`, `_lib.lua:25`) for a line of an assembled
    script (see `layout`)."""
    spans = layout()
    k = bisect.bisect_right([s.first for s in spans], line) - 1
    if k < 0 or line >= spans[k].first + spans[k].count:
        return f"user_script:{line}"  # between files, or past the last: not one of ours
    return f"{spans[k].file}:{line - spans[k].first + 1}"


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
    rate_limited: Bound
    checkpoint: Bound
    continue_run: Bound
    hold: Bound
    deps_link: Bound
    deps_apply: Bound
    batch_cancel: Bound
    deps_done: Bound

    def __init__(self, client: Any) -> None:
        self.client = client
        is_async = hasattr(client, "aclose")
        plain_source = getattr(client, "duetime_plain_scripts", False)  # see common/memory.py
        for name in SCRIPT_NAMES:
            script = (_AsyncScript if is_async else _Script)(name, plain_source)
            setattr(self, name, Bound(script, client))
