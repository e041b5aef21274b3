"""`duetime keys`: the key layout (common/keys.py, docs/keys.md) for a live namespace, each
key type with a real example key (taken from the data when there is one) and the redis-cli
command that reads it."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from duetime.common.connection import CLUSTER_SCHEMES, redact
from duetime.common.keys import GLOBAL_KEYS, PARTITION_KEYS, KeyKind, Keyspace

RUN, NAME, WORKER = "<run>", "<name>", "<worker>"


@dataclass(frozen=True)
class KeyDoc:
    pattern: str  # T = the partition's prefix `ns:{tag}:`
    type: str  # the Redis TYPE (or 'channel' for pub/sub)
    holds: str
    example: str
    command: list[str]  # the Redis command (argv) that reads the example key
    live: bool  # the example key exists right now


# The command that shows a key of each type ({k} = the key); the layout itself is
# common/keys.py's table.
READ_COMMAND = {
    "zset": ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"],
    "hash": ["HGETALL", "{k}"],
    "list": ["LRANGE", "{k}", "0", "-1"],
    "set": ["SMEMBERS", "{k}"],
    "string": ["GET", "{k}"],
    "stream": ["XREVRANGE", "{k}", "+", "-", "COUNT", "10"],
    "channel": ["PUBSUB", "NUMSUB", "{k}"],
}
LATEST_FIRST = {"done": ["ZREVRANGE", "{k}", "0", "9", "WITHSCORES"]}


def _rows(table: dict[str, KeyKind]) -> list[tuple[str, str, str, list[str]]]:
    return [(kind.pattern, kind.type, kind.holds, LATEST_FIRST.get(name, READ_COMMAND[kind.type]))
            for name, kind in table.items()]


PER_PARTITION = _rows(PARTITION_KEYS)
GLOBAL = _rows(GLOBAL_KEYS)


class KeyGuide:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def redis_cli(self, command: list[str]) -> str:
        """The shell line that runs `command` with redis-cli (password redacted)."""
        scheme = self.url.split("://", 1)[0]
        url = redact(self.url)
        flags = []
        if scheme in CLUSTER_SCHEMES:
            url = CLUSTER_SCHEMES[scheme] + url[len(scheme):]
            flags = ["-c"]
        return shlex.join(["redis-cli", *flags, "-u", url, *command])

    def _samples(self) -> dict[str, str]:
        """Real names to build examples from: a queue, a run (a finished or running one with
        an attempt history, if any), a schedule (one running if any), a worker."""
        k, c = self.keys, self.client
        out: dict[str, str] = {}
        # replies are bytes: no duetime client sets decode_responses
        queues = sorted(m.decode() for m in cast(set[bytes], c.smembers(k.queues)))
        out["queue"] = queues[0] if queues else "default"
        pipe = c.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.zrange(k.leases(p), 0, 0)
            pipe.zrevrange(k.done(p), 0, 0)
            pipe.zrange(k.sched_due(p), 0, 99)  # every schedule is in its due index
            pipe.zrevrange(k.dead(p), 0, 0)
            pipe.zrevrange(k.uncertain(p), 0, 0)
        # a damaged key (of the wrong type) gives no sample; `duetime doctor` names it
        res = [[] if isinstance(x, Exception) else x for x in pipe.execute(raise_on_error=False)]
        leased = [m.decode() for i in range(0, len(res), 5) for m in res[i]]
        done = [m.decode() for i in range(1, len(res), 5) for m in res[i]]
        names = [m.decode() for i in range(2, len(res), 5) for m in res[i]]
        failed = [m.decode() for i in range(3, len(res), 5) for j in (i, i + 1) for m in res[j]]
        if done or leased or failed:
            # one with an attempt history if any: a run that succeeded at its first try has
            # none (its attempt is inline in the run hash, docs/keys.md); a dead or uncertain
            # run has one
            runs = done + leased + failed
            pipe = c.pipeline(transaction=False)
            for run in runs:
                pipe.exists(k.attempts(k.partition_of_run(run), run))
            had = [r for r, e in zip(runs, pipe.execute(raise_on_error=False), strict=True)
                   if e is True or e == 1]
            out["run"] = (had or runs)[0]
        if names:
            out["name"] = names[0]
            pipe = c.pipeline(transaction=False)
            for n in names:
                pipe.exists(k.sched_running(k.partition_of_schedule(n), n))
            running = [n for n, e in zip(names, pipe.execute(), strict=True) if e]
            out["running_name"] = running[0] if running else names[0]
        workers = [m.decode() for m in cast(list[bytes], c.zrevrange(k.workers, 0, 0))]
        if workers:
            out["worker"] = workers[0]
        return out

    def _example(self, name: str, kind: KeyKind, s: dict[str, str]) -> str:
        """A real key of this kind (one that exists if any does), built by the Keyspace method
        of the same name."""
        k = self.keys
        build: Callable[..., str] = getattr(k, name)  # its arguments depend on the kind
        if kind.item == "run":
            run = s.get("run", RUN)
            return build(k.partition_of_run(run) if run != RUN else 0, run)
        if kind.item == "name":
            sched = s.get("running_name" if name == "sched_running" else "name", NAME)
            return build(k.partition_of_schedule(sched) if sched != NAME else 0, sched)
        if kind.item == "queue":
            return self._first_existing([build(p, s["queue"]) for p in range(k.partitions)])
        if kind.item == "scope":  # a limit's scope: '<kind>:<name>'
            return self._first_existing([build(p, "queue:" + s["queue"])
                                         for p in range(k.partitions)])
        if kind.item == "lane":  # '<queue>|<tenant>'
            return self._first_existing([build(p, s["queue"], "") for p in range(k.partitions)])
        if kind.item == "batch":  # the newest batch of a partition, if any
            for p in range(k.partitions):
                newest = cast(list[bytes], self.client.zrevrange(k.batches(p), 0, 0))
                if newest:
                    return build(p, newest[0].decode())
            return build(0, "<batch>")
        return self._first_existing([build(p) for p in range(k.partitions)])

    def _first_existing(self, candidates: list[str]) -> str:
        pipe = self.client.pipeline(transaction=False)
        for key in candidates:
            pipe.exists(key)
        for key, exists in zip(candidates, pipe.execute(), strict=True):
            if exists:
                return key
        return candidates[0]

    def layout(self) -> list[KeyDoc]:
        k = self.keys
        s = self._samples()
        docs: list[KeyDoc] = []
        for (name, kind), (pattern, typ, holds, cmd) in zip(PARTITION_KEYS.items(), PER_PARTITION,
                                                             strict=True):
            example = self._example(name, kind, s)
            docs.append(KeyDoc("T:" + pattern, typ, holds, example,
                               [a.replace("{k}", example) for a in cmd], False))
        for pattern, typ, holds, cmd in GLOBAL:
            example = f"{k.namespace}:" + pattern.replace(WORKER, s.get("worker", WORKER)).replace(
                "<step>", "10s").replace("<minute>", str(int(time.time() // 60)))
            docs.append(KeyDoc(f"{k.namespace}:{pattern}", typ, holds, example,
                               [a.replace("{k}", example) for a in cmd], False))
        pipe = self.client.pipeline(transaction=False)
        for d in docs:
            if d.type == "channel":
                pipe.pubsub_numsub(d.example)
            else:
                pipe.exists(d.example)
        live = []
        for d, res in zip(docs, pipe.execute(), strict=True):
            exists = bool(res[0][1]) if d.type == "channel" else bool(res)
            live.append(KeyDoc(d.pattern, d.type, d.holds, d.example, d.command, exists))
        return live

    def run_keys(self, run_id: str) -> dict[str, str | int]:
        k = self.keys
        p = k.partition_of_run(run_id)
        return {"partition": p, "run": k.run(p, run_id), "attempts": k.attempts(p, run_id),
                "leases": k.leases(p)}
