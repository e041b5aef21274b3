"""Opt-in replicated durability: a state change is acknowledged only once replicas have it.

Redis replicates asynchronously: a primary acknowledges a write, then ships it to its
replicas. A primary that dies in between takes the write with it, and the replica promoted in
its place never saw it (a run enqueued and acknowledged, then gone). With `wait_replicas=N`
every state-changing script call is followed, on the same connection (WAIT counts that
connection's writes) of the same node, by `WAIT N timeout`: the call is acknowledged only
when N replicas have it, or reported when fewer did within the timeout.

How: a durable client's pipelines note which slots their state-changing EVALSHA calls write
(the slot of the first key; every duetime script touches one partition, one slot) and append,
before they are sent, one WAIT per node that serves those slots (cluster: `target_nodes`, so
it travels in that node's batch, on its connection, after its writes; a single server: one
WAIT at the end). Their replies are taken off the results, so callers see the replies they
queued. A script called outside a pipeline goes through a two-command pipeline for the same
reason (a pool may hand the WAIT another connection).

Not waited for: heartbeats (a lost heartbeat shortens a lease, which the reaper already
treats as a worker lost: at-least-once covers it, and a heartbeat every third of a lease per
running run would wait on every one), partition ownership (it splits work, it is not state a
run depends on) and the registration of a waiter. Redis 7.0 has no WAITAOF; WAIT says the
replicas received the write, not that any disk has it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duetime.common.errors import InvalidInput
from duetime.common.logs import get as get_logger
from redis.crc import key_slot

log = get_logger("duetime.durability")

NOT_WAITED = ("heartbeat", "partition_owners", "wait")  # see the module docstring
ENV_REPLICAS = "DUETIME_WAIT_REPLICAS"
ENV_TIMEOUT = "DUETIME_WAIT_TIMEOUT_MS"
DEFAULT_TIMEOUT_MS = 1000
LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class Durability:
    """`replicas`: how many replicas must have each state change before it is acknowledged
    (0: Redis's own asynchronous replication); `timeout_ms`: how long a call waits for them."""

    replicas: int = 0
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) \
                or not 0 <= self.replicas <= 100:
            raise InvalidInput(f"wait_replicas must be an integer in 0..100, got {self.replicas!r}")
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int) \
                or not 1 <= self.timeout_ms <= 600_000:
            raise InvalidInput(f"wait_timeout_ms must be an integer in 1..600000, got "
                               f"{self.timeout_ms!r} (0, WAIT's 'forever', is not allowed)")

    @property
    def on(self) -> bool:
        return self.replicas > 0

    @classmethod
    def from_env(cls) -> Durability:
        """DUETIME_WAIT_REPLICAS / DUETIME_WAIT_TIMEOUT_MS (what `--durability replicated`
        sets for the process and the worker processes it starts)."""
        def number(name: str, default: int) -> int:
            raw = os.environ.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(raw)
            except ValueError:
                raise InvalidInput(f"{name} must be an integer, got {raw!r}") from None

        return cls(number(ENV_REPLICAS, 0), number(ENV_TIMEOUT, DEFAULT_TIMEOUT_MS))


@dataclass(frozen=True)
class Short:
    """A node whose replicas acknowledged fewer writes than asked within the timeout."""

    node: str
    acked: int
    wanted: int
    timeout_ms: int

    def __str__(self) -> str:
        return (f"{self.acked} of {self.wanted} replica(s) of {self.node} acknowledged within "
                f"{self.timeout_ms} ms")


def _written_shas() -> set[str]:
    from duetime.common import scripts

    out = set()
    for name in scripts.SCRIPT_NAMES:
        if name not in NOT_WAITED:
            out |= {scripts.sha(name), scripts.plain(name).sha}
    return out


_WRITES: set[str] | None = None


def writes(sha: str) -> bool:
    """The script with this sha changes state (and is waited for)."""
    global _WRITES
    if _WRITES is None:
        _WRITES = _written_shas()
    return sha in _WRITES


class _Reporter:
    """Logs short acknowledgements: the first, then at most one line per LOG_EVERY_S."""

    def __init__(self) -> None:
        self.last = 0.0
        self.unlogged = 0

    def __call__(self, shorts: list[Short]) -> None:
        now = time.monotonic()
        self.unlogged += len(shorts)
        if now - self.last >= LOG_EVERY_S:
            log.error("writes not replicated in time: they exist on the primary only and are "
                      "lost if it fails before its replicas have them; check the replicas "
                      "(INFO replication) and wait_timeout_ms", detail=str(shorts[0]),
                      count=self.unlogged)
            self.last, self.unlogged = now, 0


report = _Reporter()


class _Sealer:
    """What one pipeline wrote, and the WAITs that follow it."""

    def __init__(self, client: Any, d: Durability, cluster: bool) -> None:
        self.client, self.d, self.cluster = client, d, cluster
        self.slots: set[int] = set()
        self.plain_write = False
        self.waits: list[str] = []  # node names, in the order their WAITs were queued

    def note(self, args: tuple[Any, ...]) -> None:
        if len(args) > 3 and str(args[0]).upper() == "EVALSHA" and writes(_text(args[1])):
            if self.cluster and int(args[2]) > 0:
                self.slots.add(key_slot(_bytes(args[3])))
            self.plain_write = True

    def targets(self) -> list[Any]:
        """The cluster nodes serving the written slots (as the client knows the slot map)."""
        nodes: dict[str, Any] = {}
        manager = self.client.nodes_manager
        for slot in self.slots:
            node = manager.get_node_from_slot(slot)
            nodes[node.name] = node
        return list(nodes.values())

    def reset(self) -> None:
        self.slots.clear()
        self.plain_write = False
        self.waits = []

    def check(self, results: list[Any]) -> tuple[list[Any], list[Short]]:
        """The caller's results, and the nodes whose replicas fell short."""
        n = len(self.waits)
        if not n:
            return results, []
        mine, theirs = results[:-n], results[-n:]
        shorts = []
        for node, acked in zip(self.waits, theirs, strict=True):
            got = acked if isinstance(acked, int) else -1
            if got < self.d.replicas:
                shorts.append(Short(node if got >= 0 else f"{node} ({acked})", max(got, 0),
                                    self.d.replicas, self.d.timeout_ms))
        return mine, shorts


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def seal(pipe: Any, client: Any, d: Durability, cluster: bool, is_async: bool) -> Any:
    """Make `pipe` durable (see the module docstring): instance attributes shadow its
    execute_command and execute. After execute, `pipe.duetime_shorts` lists the nodes whose
    replicas fell short (also logged)."""
    sealer = _Sealer(client, d, cluster)
    pipe.duetime_sealer = sealer
    pipe.duetime_shorts = []
    queue = pipe.execute_command
    run = pipe.execute

    def execute_command(*args: Any, **kwargs: Any) -> Any:
        sealer.note(args)
        return queue(*args, **kwargs)

    def add_waits() -> None:
        if cluster:
            for node in sealer.targets():
                queue("WAIT", d.replicas, d.timeout_ms, target_nodes=node)
                sealer.waits.append(node.name)
        elif sealer.plain_write:
            queue("WAIT", d.replicas, d.timeout_ms)
            sealer.waits.append("the server")

    def finish(results: list[Any]) -> list[Any]:
        mine, shorts = sealer.check(results)
        pipe.duetime_shorts = shorts
        sealer.reset()
        if shorts:
            report(shorts)
        return mine

    if is_async:
        async def aexecute(*args: Any, **kwargs: Any) -> Any:
            if cluster and sealer.slots:
                await client.initialize()  # the slot map (a no-op once it is known)
            add_waits()
            try:
                return finish(await run(*args, **kwargs))
            finally:
                sealer.reset()

        pipe.execute = aexecute
    else:
        def execute(*args: Any, **kwargs: Any) -> Any:
            add_waits()
            try:
                return finish(run(*args, **kwargs))
            finally:
                sealer.reset()

        pipe.execute = execute
    pipe.execute_command = execute_command
    return pipe


def make_durable(client: Any, d: Durability, cluster: bool, is_async: bool) -> Any:
    """Every pipeline of `client` is sealed; `client.duetime_durability` tells the scripts
    module to send a lone script call through a pipeline."""
    if not d.on:
        return client
    make: Callable[..., Any] = client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make(*args, **kwargs)
        if getattr(pipe, "transaction", False) is True:  # MULTI/EXEC: duetime sends none
            return pipe
        return seal(pipe, client, d, cluster, is_async)

    client.pipeline = pipeline
    client.duetime_durability = d
    return client
