"""`duetime keys`: the key layout (docs/keys.md) for a live namespace, each key type with a real
example key (taken from the data when there is one) and the redis-cli command that reads it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import redis
from duetime.common.connection import CLUSTER_SCHEMES, redact
from duetime.common.keys import Keyspace

Q, RUN, NAME, WORKER = "<queue>", "<run>", "<name>", "<worker>"


@dataclass(frozen=True)
class KeyDoc:
    pattern: str  # T = the partition's prefix `ns:{tag}:`
    type: str  # the Redis TYPE (or 'channel' for pub/sub)
    holds: str
    example: str
    command: list[str]  # the Redis command (argv) that reads the example key
    live: bool  # the example key exists right now


# (pattern, type, holds, command template with {k} for the key)
PER_PARTITION = (
    ("due:<queue>", "zset", "run id -> due time (ms); claimable once due <= now",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("retry:<queue>", "zset", "run id -> retry time (ms) after a failed attempt",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("leases", "zset", "running run id -> lease expiry (ms): the reaper's index",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("lease:<run>", "string", "owner token 'worker-id:fence', PX TTL (PTTL = lease left)",
     ["GET", "{k}"]),
    ("run:<run>", "hash", "the run record (plain fields; payload is msgpack)", ["HGETALL", "{k}"]),
    ("attempts:<run>", "list", "one JSON entry per finished attempt", ["LRANGE", "{k}", "0", "-1"]),
    ("sched:<name>", "hash", "schedule definition and evaluation state", ["HGETALL", "{k}"]),
    ("sched_due", "zset", "schedule name -> next fire time (ms)", ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("schedules", "zset", "schedule name -> created (ms): the partition's schedule index",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("sched_running:<name>", "set", "runs running now of a schedule whose overlap policy is not allow",
     ["SMEMBERS", "{k}"]),
    ("deadlines", "zset", "run id -> starting deadline (ms); later: missed",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("dead", "zset", "dead-lettered run id -> time (ms)", ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("uncertain", "zset", "uncertain run id -> time (ms): an operator decides",
     ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("done", "zset", "finished run id -> time (ms), for listing and retention",
     ["ZREVRANGE", "{k}", "0", "9", "WITHSCORES"]),
    ("events", "stream", "capped lifecycle events, for audit", ["XREVRANGE", "{k}", "+", "-", "COUNT", "10"]),
    ("owner", "string", "id of the scheduler evaluating this partition, PX TTL", ["GET", "{k}"]),
)
GLOBAL = (
    ("meta", "hash", "partition count and format version of the namespace", ["HGETALL", "{k}"]),
    ("queues", "set", "every queue name used in the namespace", ["SMEMBERS", "{k}"]),
    ("workers", "zset", "worker id -> last heartbeat (ms)", ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("worker:<worker>", "hash", "a live worker: queues, concurrency, in-flight (expires)",
     ["HGETALL", "{k}"]),
    ("schedulers", "zset", "scheduler id -> last seen (ms)", ["ZRANGE", "{k}", "0", "-1", "WITHSCORES"]),
    ("wake", "channel", "pub/sub: '<partition>|<queue>|<due ms>' wakes idle workers",
     ["PUBSUB", "NUMSUB", "{k}"]),
)


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
        """Real names to build examples from: a queue, a run (one holding a lease if any), a
        schedule (one running if any), a worker."""
        k, c = self.keys, self.client
        out: dict[str, str] = {}
        queues = sorted(m.decode() for m in c.smembers(k.queues))
        out["queue"] = queues[0] if queues else "default"
        pipe = c.pipeline(transaction=False)
        for p in range(k.partitions):
            pipe.zrange(k.leases(p), 0, 0)
            pipe.zrevrange(k.done(p), 0, 0)
            pipe.zrange(k.schedules(p), 0, 99)
        res = pipe.execute()
        leased = [m.decode() for i in range(0, len(res), 3) for m in res[i]]
        done = [m.decode() for i in range(1, len(res), 3) for m in res[i]]
        names = [m.decode() for i in range(2, len(res), 3) for m in res[i]]
        if leased:
            out["lease_run"] = leased[0]
        if done or leased:
            out["run"] = (done or leased)[0]
        if names:
            out["name"] = names[0]
            pipe = c.pipeline(transaction=False)
            for n in names:
                pipe.exists(k.sched_running(k.partition_of_schedule(n), n))
            running = [n for n, e in zip(names, pipe.execute(), strict=True) if e]
            out["running_name"] = running[0] if running else names[0]
        workers = [m.decode() for m in c.zrevrange(k.workers, 0, 0)]
        if workers:
            out["worker"] = workers[0]
        return out

    def _example(self, pattern: str, s: dict[str, str]) -> str:
        k = self.keys
        if pattern.endswith("<run>"):
            run = s.get("lease_run" if pattern.startswith("lease:") else "run", RUN)
            p = k.partition_of_run(run) if run != RUN else 0
            return k.prefix(p) + pattern.replace(RUN, run)
        if pattern.endswith("<name>"):
            name = s.get("running_name" if pattern.startswith("sched_running") else "name", NAME)
            p = k.partition_of_schedule(name) if name != NAME else 0
            return k.prefix(p) + pattern.replace(NAME, name)
        if Q in pattern:
            q = s["queue"]
            kind = pattern.split(":", 1)[0]
            return self._first_existing([f"{k.prefix(p)}{kind}:{q}" for p in range(k.partitions)])
        return self._first_existing([k.prefix(p) + pattern for p in range(k.partitions)])

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
        for pattern, typ, holds, cmd in PER_PARTITION:
            example = self._example(pattern, s)
            docs.append(KeyDoc("T:" + pattern, typ, holds, example,
                               [a.replace("{k}", example) for a in cmd], False))
        for pattern, typ, holds, cmd in GLOBAL:
            example = f"{k.namespace}:" + pattern.replace(WORKER, s.get("worker", WORKER))
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
                "lease": k.lease(p, run_id)}
