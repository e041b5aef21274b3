"""Redis clients (standalone or cluster, sync or asyncio) and the namespace's meta record.

`redis+cluster://host:port` selects Redis Cluster; anything else is a plain server.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import hiredis
import redis
import redis.asyncio as aredis
from duetime.common import memory, scripts
from duetime.common.durability import Durability, make_durable
from duetime.common.errors import (
    FormatTooNew,
    InvalidInput,
    PartitionMismatch,
    RedisRefused,
    RedisUnavailable,
)
from duetime.common.keys import Keyspace, stored_partitions
from duetime.common.loops import HeldLoopTimer
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
META_VERSION = "1"
# The layout of the runs and attempts in a namespace (`<ns>:meta` `format`; docs/keys.md,
# "Namespace format"). 1 (or no field: every release before it): one attempts entry per ended
# attempt. 2: the attempt that succeeds a run is inline in its hash, no entry pushed (a
# format-1 worker serves a format-2 namespace beside it). 3: a run record leaves out the
# fields at their default (`created` equal to `due`, the queue 'default', the default retry
# policy: lua/_lib.lua RUN_DEFAULTS), which a format-2 process would misread. 4: a due time
# asked for as an instant (`at=`) is kept to the microsecond (the run's `due` and its due-set
# score carry a fraction of a ms), which a format-3 process would read as a damaged
# record. This version reads them all, writes 4 in a namespace it creates, and keeps writing a
# namespace's own format in an older one until `duetime migrate` moves it on (once no process
# of an older release serves it; docs/operations.md, "Upgrades and the namespace format").
# Where a partition writes, its `T:caps` field `format` says (enqueue.lua and hold.lua read it).
FORMAT = 4


# How a connection whose peer vanished (no FIN, no RST: a host that lost power, a partition, a
# NAT that forgot the flow) is found out, rather than waited on for ever (docs/operations.md,
# "Half-open connections"). Every TCP connection duetime opens gets kernel keepalive: an idle
# connection whose peer is gone fails after KEEPIDLE + KEEPINTVL * KEEPCNT = 8 s, and one
# with data sent but not acknowledged fails after TCP_USER_TIMEOUT (8 s) rather than after
# Linux's ~15 minutes of retransmissions. The worker's and the scheduler's clients also wait
# at most REPLY_TIMEOUT_S for a reply (`process_kw`): a peer whose kernel still acknowledges
# but never answers (a frozen server, a stuck proxy) is caught by that alone.
KEEPIDLE_S, KEEPINTVL_S, KEEPCNT = 5, 1, 3
USER_TIMEOUT_MS = 8000
REPLY_TIMEOUT_S = 5.0


def keepalive_kw() -> dict[str, Any]:
    """redis-py's keepalive settings for a TCP connection (the options Linux has; others keep
    what their platform has)."""
    opts: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", KEEPIDLE_S), ("TCP_KEEPINTVL", KEEPINTVL_S),
                        ("TCP_KEEPCNT", KEEPCNT), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, name):
            opts[getattr(socket, name)] = value
    return {"socket_keepalive": True, "socket_keepalive_options": opts}


def process_kw(durability: Durability | None = None) -> dict[str, Any]:
    """The client settings of a long-running process (worker, scheduler): no call waits more
    than REPLY_TIMEOUT_S for a reply that does not come (plus the WAIT of replicated
    durability, which the server itself may take that long to answer). Not for producers:
    `wait`'s BLPOP blocks for longer on purpose."""
    d = Durability.from_env() if durability is None else durability
    return {"socket_timeout": REPLY_TIMEOUT_S + (d.timeout_ms / 1000 if d.on else 0.0)}


def _tcp_defaults(url: str, kw: dict[str, Any]) -> None:
    """Keepalive on a TCP URL unless the caller chose (a unix socket takes no such options)."""
    if urlsplit(url).scheme in ("redis", "rediss"):
        for k, v in keepalive_kw().items():
            kw.setdefault(k, v)


_SECRET_PARAMS = ("password", "pass", "pwd", "auth", "token", "ssl_password", "ssl_keyfile_password")


def _secret(param: str) -> bool:
    return param.lower() in _SECRET_PARAMS or "password" in param.lower()


def redact(url: str) -> str:
    """The URL without its password -- in `user:pass@` and in query parameters such as
    `?password=` -- safe for logs and error messages. Anything unparsable is withheld whole."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
        query = "&".join(
            f"{k}=***" if _secret(k) else (f"{k}={v}" if sep else k)
            for k, sep, v in (p.partition("=") for p in parts.query.split("&") if p))
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<a Redis URL that cannot be parsed>"


def is_cluster(url: str) -> bool:
    """A `redis+cluster://` (or `rediss+cluster://`) URL."""
    return _split(url)[1]


def _split(url: str) -> tuple[str, bool]:
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return CLUSTER_SCHEMES[scheme] + url[len(scheme):], True
    return url, False


class _ExplainScriptErrors:
    """An error raised inside one of duetime's scripts names the script's file and line
    (`claim.lua:30`), not a line of the assembled source (common.scripts.explain)."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError as exc:
            raise scripts.explained(exc) from None


class _Connection(_ExplainScriptErrors, redis.Connection):
    pass


class _SSLConnection(_ExplainScriptErrors, redis.SSLConnection):
    pass


_SYNC = {redis.Connection: _Connection, redis.SSLConnection: _SSLConnection}


# EVAL/EVALSHA take their keys after a count. redis-py 8's cluster client routes commands by
# "policies": without one for them, it asks the *default node* (`COMMAND GETKEYS`) where each
# script call goes: one more round trip per call, and, once that node has died, every script
# call fails although the replica that replaced it serves the slot (found in a failover test).
# Routed as keyed commands, the slot comes from the first key, locally. redis-py before 8 has
# no policies and routes EVAL/EVALSHA by their first key itself: nothing to add there. The
# names come from the public `redis.commands.policies` (which re-exports the policy types), so
# no private module of redis-py is imported, and `import duetime` works on every redis-py the
# dependency range allows (tests/packaging/test_floors.py).
def _script_policy_resolvers() -> tuple[Any, Any] | None:
    """(sync resolver class, async resolver class), or None where redis-py has no policies."""
    try:
        # the policy types are re-exported there by import (redis-py declares no __all__)
        from redis.commands.policies import (  # type: ignore[attr-defined, unused-ignore]
            AsyncBasePolicyResolver,
            AsyncPolicyResolver,
            AsyncStaticPolicyResolver,
            BasePolicyResolver,
            CommandPolicies,
            PolicyResolver,
            RequestPolicy,
            ResponsePolicy,
            StaticPolicyResolver,
        )
    except ImportError:
        return None
    keyed = CommandPolicies(request_policy=RequestPolicy.DEFAULT_KEYED,
                            response_policy=ResponsePolicy.DEFAULT_KEYED)
    policies = {"core": {c: keyed for c in ("eval", "evalsha", "eval_ro", "evalsha_ro")}}

    class ScriptPolicies(BasePolicyResolver):
        def __init__(self, fallback: PolicyResolver | None = None) -> None:
            super().__init__(policies, fallback or StaticPolicyResolver())

        def with_fallback(self, fallback: PolicyResolver) -> PolicyResolver:
            return ScriptPolicies(fallback)

    class AsyncScriptPolicies(AsyncBasePolicyResolver):
        def __init__(self, fallback: AsyncPolicyResolver | None = None) -> None:
            super().__init__(policies, fallback or AsyncStaticPolicyResolver())

        def with_fallback(self, fallback: AsyncPolicyResolver) -> AsyncPolicyResolver:
            return AsyncScriptPolicies(fallback)

    return ScriptPolicies, AsyncScriptPolicies


_RESOLVERS = _script_policy_resolvers()


def _policy_kw(is_async: bool) -> dict[str, Any]:
    """The cluster client's `policy_resolver` argument, where redis-py takes one."""
    if _RESOLVERS is None:
        return {}
    return {"policy_resolver": _RESOLVERS[1 if is_async else 0]()}


class _Cluster(RedisCluster):
    """redis-py's cluster pipelines get a resolver of their own, not the client's."""

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        # redis-py leaves RedisCluster.pipeline unannotated
        pipe = super().pipeline(*args, **kwargs)  # type: ignore[no-untyped-call]
        if hasattr(self, "_policy_resolver"):  # redis-py 8 and later (see _RESOLVERS)
            pipe._policy_resolver = self._policy_resolver
        return pipe


def sent_once(pipe: Any) -> Any:
    """`pipe`, which redis-py will not send again if it is a cluster pipeline.

    On a connection error or CLUSTERDOWN, redis-py sends a cluster pipeline's whole stack
    again after a back-off, the commands its healthy nodes already ran included (up to 10
    times in redis-py 8.2, 3 before). An enqueue sends a chunk of new random ids as `fresh`
    (created without an EXISTS) the first time only; redis-py resending it would create
    those runs again, resetting any a worker had claimed since. So the enqueue's own retry
    (duetime/client/runs.py `retry_s`) resends what was not acknowledged, not marked fresh.
    A plain server's pipeline needs nothing here: its connections resend nothing (NO_RETRIES).
    Only the enqueue's pipelines are sent once: the rest of a cluster client keeps redis-py's
    retries, which a read during a topology change needs (a read is safe to repeat)."""
    if isinstance(pipe, ClusterPipeline):
        pipe.retry = Retry(NoBackoff(), 0)
        if hasattr(pipe, "cluster_error_retry_attempts"):  # redis-py before 6 reads this one
            pipe.cluster_error_retry_attempts = 0
    return pipe


def _url_error(url: str, exc: Exception) -> InvalidInput:
    return InvalidInput(f"not a Redis URL: {redact(url)!r} ({exc}; expected redis://host:port/db, "
                        "rediss://..., unix://path, redis+cluster://host:port or memory://name)")


def sync_client(url: str, durability: Durability | None = None, **kw: Any) -> redis.Redis:
    """Every connection it opens loads duetime's scripts first (common.scripts). A URL that is
    not one is InvalidInput; a cluster none of whose nodes answers is RedisUnavailable.
    `durability` (default: DUETIME_WAIT_REPLICAS): WAIT after each state change
    (common.durability)."""
    client: redis.Redis = _durable(url, durability, False, lambda: _sync_client(url, **kw))
    return client


def _durable(url: str, durability: Durability | None, is_async: bool,
             make: Callable[[], Any]) -> Any:
    """The client `make()` opens for `url`, made durable (common.durability) unless it is in
    memory; a URL that is not one is InvalidInput, a cluster none of whose nodes answers
    RedisUnavailable (only the sync cluster client asks its nodes at once)."""
    d = Durability.from_env() if durability is None else durability
    try:
        client = make()
        if memory.is_memory(url):
            return client
        return make_durable(client, d, cluster=_split(url)[1], is_async=is_async)
    except ValueError as exc:
        raise _url_error(url, exc) from None
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException) as exc:
        raise unavailable(url, exc) from None


# NO_RETRIES: a plain server's connections never send a command again themselves. A resend
# after a lost reply repeats a call that may have run: a claim (its runs then wait for their
# lease to expire), an enqueue chunk sent `fresh` (created again without an EXISTS). duetime's
# callers retry themselves, knowing what a resend means (an enqueue's `retry_s`, the worker's
# and the scheduler's back-off). redis-py gives a client made from a URL no retries unless
# told, but its defaults move (`redis.Redis()` itself resends 10 times in 8.2, the cluster
# client went from 3 to 10): duetime states its own. Cluster clients: `_Cluster`, `sent_once`.
def _sync_client(url: str, **kw: Any) -> redis.Redis:
    if memory.is_memory(url):
        return memory.sync_client(url)  # type: ignore[no-any-return]
    real, cluster = _split(url)
    kw.setdefault("socket_connect_timeout", 5)
    _tcp_defaults(real, kw)
    if cluster:  # the cluster client runs its own handshake, then calls ours
        ssl = urlsplit(real).scheme == "rediss"
        return _Cluster.from_url(  # type: ignore[return-value]
            real, redis_connect_func=scripts.load_scripts, **_policy_kw(False),
            connection_class=_SSLConnection if ssl else _Connection, **kw)
    kw.setdefault("retry", Retry(NoBackoff(), 0))  # see NO_RETRIES
    client = redis.Redis.from_url(real, redis_connect_func=scripts.connect_and_load, **kw)
    pool = client.connection_pool
    pool.connection_class = _SYNC.get(pool.connection_class, pool.connection_class)
    return client


class _HiredisPacking:
    """Commands packed by hiredis (C), as redis-py's sync client does; its asyncio client
    packs in Python, which cost the worker ~100 µs per pipelined script call."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        return [hiredis.pack_command(args)]


class _AsyncExplainScriptErrors:
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError as exc:
            raise scripts.explained(exc) from None


# asyncio's default high-water mark of a transport's write buffer: a write that leaves less
# than this buffered never makes StreamWriter.drain() wait
WRITE_HIGH_WATER = 64 * 1024


class _UntimedSmallWrites:
    """A command the transport takes whole is written without a timeout. redis-py bounds
    every write of a client with a socket timeout (the worker's have one) by
    `asyncio.wait_for`, which wraps it in a task of its own: ~40 µs here for each pipeline,
    a claim's and a report's, two per claimed batch. A write that leaves less than
    WRITE_HIGH_WATER in the transport's buffer never waits (drain returns at once), so it
    needs no bound: it is sent with the timeout set aside for the write alone. Anything else
    (not connected yet: the handshake reads with the timeout; a large write; a pending
    buffer) goes through redis-py's own path, bounded as before. Reads are unchanged."""

    socket_timeout: float | None
    is_connected: bool
    _writer: asyncio.StreamWriter | None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if timeout and self.is_connected and check_health:
            await self.check_health()  # type: ignore[attr-defined] # its PING: timeout in place
            check_health = False
        if not timeout or not self.is_connected or not self._takes_whole(command):
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        self.socket_timeout = None
        try:
            await super().send_packed_command(command, False)  # type: ignore[misc]
        finally:
            self.socket_timeout = timeout

    def _takes_whole(self, command: Any) -> bool:
        writer = self._writer
        if writer is None:
            return False
        size = len(command) if isinstance(command, bytes | str) else sum(map(len, command))
        return writer.transport.get_write_buffer_size() + size < WRITE_HIGH_WATER


class _RepliesOutwaitAHeldLoop:
    """A reply's timeout counts only time in which the loop could read it. redis-py bounds a
    read by the socket timeout with `asyncio.timeout`, measured on the wall clock: a task body
    that blocks the worker's loop for longer (a sync call in an `async def`) made every read
    in flight time out when the loop came back, the replies waiting in the socket thrown away
    with the connection. A claim's lost reply left its batch leased to no one until the lease
    ran out. The read goes through redis-py with the timeout set aside and a `HeldLoopTimer`
    (common/loops.py) in its place; a read given its own timeout (pub/sub) is redis-py's alone."""

    socket_timeout: float | None

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.socket_timeout
        task = asyncio.current_task()
        given = kwargs.get("timeout", args[1] if len(args) > 1 else None)
        if not bound or given is not None or task is None:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        timer = HeldLoopTimer(task, bound)
        self.socket_timeout = None
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except asyncio.CancelledError:
            if timer.timed_out():  # redis-py dropped the connection, as on its own timeout
                raise redis.TimeoutError(f"Timeout reading from {self._where()}") from None
            raise
        finally:
            self.socket_timeout = bound
            timer.cancel()

    def _where(self) -> str:
        return str(self._host_error())  # type: ignore[attr-defined]


class _FastConnection(_AsyncExplainScriptErrors, _RepliesOutwaitAHeldLoop, _UntimedSmallWrites,
                      _HiredisPacking, aredis.Connection):
    pass


class _FastSSLConnection(_AsyncExplainScriptErrors, _RepliesOutwaitAHeldLoop,
                         _UntimedSmallWrites, _HiredisPacking, aredis.SSLConnection):
    pass


# looked up with whatever class a node's settings hold (None where they name none)
_FAST: dict[type[AbstractConnection] | None, type[aredis.Connection]] = {
    aredis.Connection: _FastConnection, aredis.SSLConnection: _FastSSLConnection}


def async_client(url: str, durability: Durability | None = None, **kw: Any) -> aredis.Redis:
    """`sync_client` for asyncio code (scripts loaded on connect, durability, URL errors)."""
    client: aredis.Redis = _durable(url, durability, True, lambda: _async_client(url, **kw))
    return client


def _async_client(url: str, **kw: Any) -> aredis.Redis:
    if memory.is_memory(url):
        return memory.async_client(url)  # type: ignore[no-any-return]
    real, cluster = _split(url)
    client: aredis.Redis | AsyncRedisCluster
    kw.setdefault("socket_connect_timeout", 5)
    _tcp_defaults(real, kw)
    if cluster:
        # No retries inside redis-py: on a connection error its cluster pipeline closes every
        # connection of the client (and sleeps) before it retries, which broke the claims
        # running side by side on the live nodes whenever one went to a dead primary. duetime's
        # loops retry themselves, per partition, and re-read the slot map (refresh_topology).
        kw.setdefault("retry", AsyncRetry(NoBackoff(), 0))
        client = AsyncRedisCluster.from_url(real, **_policy_kw(True), **kw)
        # redis-py's asyncio cluster client takes no connect hook: give it to the connection
        # settings every node (present and discovered) is made from
        for target in (client, client.nodes_manager):
            target.connection_kwargs["redis_connect_func"] = scripts.aconnect_and_load
            cls = target.connection_kwargs.get("connection_class")
            target.connection_kwargs["connection_class"] = _FAST.get(cls, cls)
        for node in client.get_nodes():
            node.connection_kwargs["redis_connect_func"] = scripts.aconnect_and_load
            node.connection_class = _FAST.get(node.connection_class, node.connection_class)
        return client  # type: ignore[return-value]
    kw.setdefault("retry", AsyncRetry(NoBackoff(), 0))  # see NO_RETRIES
    client = aredis.Redis.from_url(real, redis_connect_func=scripts.aconnect_and_load, **kw)
    pool = client.connection_pool
    pool.connection_class = _FAST.get(pool.connection_class, pool.connection_class)
    return client


# Errors that say where a key lives or whether its node can take writes changed, or is
# changing: a dead primary, its replica not promoted yet (CLUSTERDOWN, MASTERDOWN), a slot
# that moved (MOVED, ASK, TRYAGAIN), a node still loading or that just lost its scripts. They
# pass within seconds; a caller retries soon (short back-off) and re-reads the topology.
TOPOLOGY_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, OSError,
    redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
    redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError, redis.exceptions.BusyLoadingError,
    redis.exceptions.NoScriptError, redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ClusterError, redis.exceptions.RedisClusterException,
)
_TOPOLOGY_CODES = ("CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "MOVED", "ASK", "READONLY", "LOADING",
                   "NOSCRIPT")


_REDIS_PY = os.path.dirname(redis.__file__) + os.sep


def client_glitch(exc: BaseException) -> bool:
    """An AttributeError or TypeError raised inside redis-py's own code, not ours. Its asyncio
    cluster client, when one task closes a connection while another writes on it (a slot
    move or a failover makes it do so), fails with "'NoneType' object has no attribute
    'writelines'": the connection is gone, as a ConnectionError would have said, and the call
    is retried as after one, logged as a warning, not as a bug of duetime's with a traceback."""
    if not isinstance(exc, AttributeError | TypeError):
        return False
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def topology_error(exc: BaseException) -> bool:
    """A failover or a slot move in progress, or an unreachable node: soon over. Anything
    else (OOM, WRONGTYPE, a script error) is a refusal that retrying soon will not cure."""
    if isinstance(exc, TOPOLOGY_ERRORS) or client_glitch(exc):
        return True
    code = getattr(exc, "code", None) or (str(exc).split(" ", 1)[0] if str(exc) else "")
    return code in _TOPOLOGY_CODES


def refresh_topology(client: Any) -> None:
    """A cluster client re-reads the slot map now (CLUSTER SLOTS from a live node), so calls go
    to the replica promoted in place of a dead primary at once, rather than after redis-py's
    own retries ran out. Nothing for a plain client; a failure is left to the next call."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        return
    with suppress(redis.RedisError, OSError):
        nodes.initialize()


async def arefresh_topology(client: Any) -> None:
    """`refresh_topology` for an asyncio cluster client."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        return
    with suppress(redis.RedisError, OSError):
        await nodes.initialize()


def unavailable(url: str, exc: BaseException) -> RedisUnavailable:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RedisUnavailable(f"cannot reach Redis at {redact(url)}: {reason}")


# What to do about a refusal, by Redis's error code.
ADVICE = {
    "OOM": "the server is at maxmemory and refuses writes: raise maxmemory or free memory "
           "(`duetime dead purge`, a shorter --retention); `duetime doctor` shows the numbers",
    "READONLY": "this is a read-only replica (after a failover?): point the URL at the primary, "
                "or use a redis+cluster:// URL so the client follows the topology",
    "NOPERM": "the Redis ACL user lacks a permission duetime needs: see the ACL roles in "
              "docs/operations.md",
    "PAYLOAD_TOO_LARGE": "the namespace caps payloads (`duetime limits payload`): pass a "
                         "reference to large data instead of the data",
    "WRONGTYPE": "a duetime key holds another type (written by something else?): "
                 "`duetime keys` shows the layout",
    "NOSCRIPT": "the server lost duetime's scripts mid-call (restart or failover): retry",
    "BUSY": "a script is running too long on the server: retry, and check the server's log",
    "MASTERDOWN": "the replica lost its primary: wait for the failover, then retry",
    "CLUSTERDOWN": "the cluster is down or resharding: wait for it, then retry",
    "TRYAGAIN": "the cluster is moving this partition's slot to another node (resharding) and "
                "the client's own retries ran out: retry in a moment (an enqueue with the same "
                "key creates its run once)",
}

# redis-py's cluster client answers TRYAGAIN, ASK and MOVED itself, a bounded number of times;
# when they run out it raises this, and the TRYAGAIN behind it is lost.
_RETRIES_RAN_OUT = redis.exceptions.ClusterError


def refused(url: str, exc: redis.ResponseError | redis.exceptions.ClusterError) -> RedisRefused:
    """A refusal as a duetime error: Redis's words, then what to do."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    code = getattr(exc, "status_code", None) or (text.split(" ", 1)[0] if text[:1].isupper() else "")
    if not isinstance(exc, redis.ResponseError):  # ClusterDownError is both: it keeps its code
        code = "TRYAGAIN"  # the client's redirections ran out: see _RETRIES_RAN_OUT
    elif isinstance(exc, redis.exceptions.OutOfMemoryError):
        code = "OOM"
    elif isinstance(exc, redis.exceptions.ReadOnlyError):
        code = "READONLY"
    elif isinstance(exc, redis.exceptions.NoPermissionError):
        code = "NOPERM"
    advice = ADVICE.get(code, "see the server's log; `duetime doctor` checks the deployment")
    return RedisRefused(f"Redis at {redact(url)} refused the call: {text} ({advice})", code)


@contextmanager
def translated(url: str) -> Iterator[None]:
    """Connection errors inside become RedisUnavailable, refusals RedisRefused with advice;
    both with a password-free message."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException) as exc:
        raise unavailable(url, exc) from None
    except (redis.ResponseError, _RETRIES_RAN_OUT) as exc:
        raise refused(url, exc) from None


def ensure_meta(client: redis.Redis, keys: Keyspace, url: str) -> None:
    """Record the partition count and the layout format on first use; refuse a namespace made
    with another partition count, or holding a newer format than this version reads. Reads
    first: a process starting while the server refuses writes (maxmemory) still starts."""
    try:
        stored, fmt = client.hmget(keys.meta, "partitions", "format")
        new = stored is None and fmt is None
        if stored is None:
            client.hsetnx(keys.meta, "partitions", keys.partitions)
            client.hsetnx(keys.meta, "version", META_VERSION)
            client.hsetnx(keys.meta, "created_ms", int(time.time() * 1000))
            stored = client.hget(keys.meta, "partitions")
        if fmt is None:
            # a new namespace is this version's format from the start; one written by a release
            # before formats (format 1, whose workers may still serve it) is marked 2, the last
            # format they serve beside this one (duetime migrate takes it on to 3)
            with suppress(redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError):
                if client.hsetnx(keys.meta, "format", FORMAT if new else 2) and new:
                    mark_partitions_format(client, keys, FORMAT)
            fmt = client.hget(keys.meta, "format")
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise unavailable(url, exc) from None
    n = stored_partitions(stored, keys.meta)
    if n is not None and n != keys.partitions:
        raise PartitionMismatch(
            f"namespace {keys.namespace!r} was created with {n} partitions, "
            f"this process is configured with {keys.partitions}"
        )
    check_format(fmt, keys)


def mark_partitions_format(client: redis.Redis, keys: Keyspace, fmt: int,
                           progress: Callable[[int], None] | None = None) -> None:
    """Tell every partition the layout its scripts write (`T:caps` field `format`; a cluster
    client sends each partition's write to its node). After `<ns>:meta` says so: a process of
    an older release starting meanwhile is refused by the meta's format before any partition
    writes a layout it would misread."""
    step = 64
    for first in range(0, keys.partitions, step):
        pipe = client.pipeline(transaction=False)
        for p in range(first, min(first + step, keys.partitions)):
            pipe.hset(keys.caps(p), "format", fmt)
        pipe.execute()
        if progress is not None:
            progress(min(step, keys.partitions - first))


def check_format(raw: bytes | str | None, keys: Keyspace) -> int:
    """The namespace's layout format as stored (absent: 1); FormatTooNew past this version's."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        fmt = int(text) if text not in (None, "") else 1
    except ValueError:
        fmt = -1
    if fmt > FORMAT or fmt < 1:
        raise FormatTooNew(
            f"namespace {keys.namespace!r} holds layout format {text} ({keys.meta} field "
            f"'format'); this version of duetime reads formats 1..{FORMAT}: upgrade it to the "
            "release that wrote the namespace (docs/operations.md, 'Upgrades and the "
            "namespace format')")
    return fmt


def server_time_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return sec * 1000 + usec // 1000
