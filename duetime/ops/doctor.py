"""`duetime doctor`: which guarantees a deployment actually has, and what to fix.

Each check returns findings with a level: `ok`, `info`, `warn` (works, with a weaker
guarantee) or `fatal` (duetime must not run like this: runs could be lost or misrouted).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
from redis.cluster import RedisCluster

from duetime.client.schedules import ScheduleStore
from duetime.common.errors import DamagedState, RedisRefused, RedisUnavailable
from duetime.common.keys import Keyspace, stored_partitions
from duetime.ops.inspect import Inspector
from duetime.ops.schedule_listing import lint_schedules
from duetime.ops.surge import DEFAULT_MAX_PER_SECOND, profile

MIN_REDIS = (7, 0)
MIN_VALKEY = (7, 2)
CLOCK_WARN_S = 1.0


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    message: str
    advice: str = ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:3] if x.isdigit())


def _info(client: redis.Redis, section: str) -> dict[str, Any]:
    info = client.info(section)
    if isinstance(client, RedisCluster) and info and isinstance(next(iter(info.values())), dict):
        return next(iter(info.values()))  # one node's view
    return info


def check_server(client: redis.Redis) -> list[Finding]:
    info = _info(client, "server")
    if "valkey_version" in info or info.get("server_name") == "valkey":
        version = str(info.get("valkey_version", info.get("redis_version")))
        name, minimum = "Valkey", MIN_VALKEY
    else:
        name, version, minimum = "Redis", str(info.get("redis_version", "0")), MIN_REDIS
    want = ".".join(map(str, minimum))
    if _version(version) < minimum:
        return [Finding("server", "fatal", f"{name} {version} is older than {want}",
                        f"upgrade to {name} >= {want} (duetime's scripts need its commands)")]
    return [Finding("server", "ok", f"{name} {version} (>= {want})")]


def check_memory(client: redis.Redis) -> list[Finding]:
    info = _info(client, "memory")
    policy = str(info.get("maxmemory_policy", "unknown"))
    if policy != "noeviction":
        found = [Finding("maxmemory-policy", "fatal",
                         f"maxmemory-policy is {policy!r}: under memory pressure Redis would "
                         "silently delete run records and indexes",
                         "set `maxmemory-policy noeviction` (CONFIG SET and in redis.conf); "
                         "writes then fail loudly instead")]
    else:
        found = [Finding("maxmemory-policy", "ok", "maxmemory-policy is noeviction")]
    limit, used = int(info.get("maxmemory", 0) or 0), int(info.get("used_memory", 0) or 0)
    if limit and used >= limit:
        found.append(Finding(
            "memory", "fatal", f"used memory {used:,} B has reached maxmemory {limit:,} B: the "
            "server refuses writes, so no run is created, claimed, completed or recovered "
            "(heartbeats still extend leases)",
            "raise maxmemory, or free memory: `duetime dead purge`, a shorter --retention"))
    elif limit and used >= 0.9 * limit:
        found.append(Finding("memory", "warn", f"used memory {used:,} B is {used / limit:.0%} "
                             f"of maxmemory {limit:,} B",
                             "raise maxmemory before writes are refused"))
    return found


def check_persistence(client: redis.Redis) -> list[Finding]:
    info = _info(client, "persistence")
    try:
        cfg = client.config_get("appendfsync")
        save = client.config_get("save").get("save", "")
        fsync = cfg.get("appendfsync", "")
    except redis.ResponseError:  # CONFIG is often disabled on managed services
        save, fsync = None, ""
    if int(info.get("aof_enabled", 0)):
        if fsync == "no":
            return [Finding("persistence", "warn", "AOF is on with appendfsync no: a crash can "
                            "lose the last ~30 s of writes", "set `appendfsync everysec`")]
        return [Finding("persistence", "ok", f"AOF is on (appendfsync {fsync or 'unknown'})")]
    if save is None or save:
        return [Finding("persistence", "warn", "RDB snapshots only: a crash loses every run "
                        "created or finished since the last snapshot",
                        "turn on AOF: `appendonly yes`, `appendfsync everysec`")]
    return [Finding("persistence", "warn", "no persistence (AOF off, no RDB snapshots): a "
                    "restart loses every run and schedule",
                    "for anything but development: `appendonly yes`, `appendfsync everysec`")]


def check_cluster(client: redis.Redis) -> list[Finding]:
    if isinstance(client, RedisCluster):
        state = client.cluster_info().get("cluster_state", "unknown")
        if state != "ok":
            return [Finding("cluster", "fatal", f"cluster_state is {state!r}",
                            "fix the cluster (CLUSTER INFO / redis-cli --cluster check)")]
        return [Finding("cluster", "ok", "Redis Cluster, cluster_state ok")]
    if int(_info(client, "cluster").get("cluster_enabled", 0)):
        return [Finding("cluster", "fatal", "the server is a cluster node but the URL is not a "
                        "cluster URL: keys of other slots would fail",
                        "use a redis+cluster:// URL")]
    return [Finding("cluster", "ok", "standalone server")]


def check_clock(client: redis.Redis) -> list[Finding]:
    t0 = time.time()
    sec, usec = client.time()
    t1 = time.time()
    offset = sec + usec / 1e6 - (t0 + t1) / 2
    text = f"this host's clock is {abs(offset):.3f}s {'behind' if offset > 0 else 'ahead of'} the server's"
    if abs(offset) > CLOCK_WARN_S:
        return [Finding("clock", "warn", text + " (due times and leases use only the server's "
                        "clock, so runs are unaffected; log times and 'last seen' ages are off)",
                        "run NTP (chrony/systemd-timesyncd) on this host and the server")]
    return [Finding("clock", "ok", text)]


def check_partitions(client: redis.Redis, keys: Keyspace, configured: int | None) -> list[Finding]:
    try:
        stored = stored_partitions(client.hget(keys.meta, "partitions"), keys.meta)
    except DamagedState as exc:
        return [Finding("partitions", "fatal", str(exc),
                        "restore the count the namespace was created with")]
    if stored is None and not client.exists(keys.queues, keys.workers, keys.tasks, keys.owners,
                                            keys.limit_config):
        # a misspelt --namespace looks like a healthy, idle one: say it plainly
        return [Finding("namespace", "warn", f"namespace {keys.namespace!r} does not exist: "
                        "no meta record and none of its keys (queues, workers, tasks, "
                        "schedulers, limits)",
                        "check --namespace / DUETIME_NAMESPACE: every process writes the meta "
                        "record when it starts")]
    if stored is None:
        return [Finding("partitions", "info", f"namespace {keys.namespace!r} has no meta record "
                        "yet (nothing was written to it)",
                        "check --namespace / DUETIME_NAMESPACE if you expected data here")]
    if configured is not None and int(stored) != configured:
        return [Finding("partitions", "fatal", f"namespace {keys.namespace!r} was created with "
                        f"{int(stored)} partitions, the app is configured with {configured}: its "
                        "keys would be routed to the wrong partitions",
                        f"configure App(partitions={int(stored)}) or use a new namespace")]
    return [Finding("partitions", "ok", f"{int(stored)} partitions (duetime:meta)")]


def check_processes(insp: Inspector) -> list[Finding]:
    out = []
    schedulers = insp.schedulers()
    owned = {p for s in schedulers for p in s.partitions}
    unowned = insp.keys.partitions - len(owned)
    if not schedulers:
        out.append(Finding("schedulers", "warn", "no live scheduler: schedules do not fire and "
                           "expired leases are not recovered",
                           "run `duetime scheduler` (two or more for availability)"))
    elif unowned:
        out.append(Finding("schedulers", "warn", f"{len(schedulers)} live scheduler(s), but "
                           f"{unowned} partition(s) have no owner right now",
                           "normal for a few seconds after a scheduler starts or dies; "
                           "otherwise check the schedulers' logs"))
    else:
        out.append(Finding("schedulers", "ok", f"{len(schedulers)} live scheduler(s) own all "
                           f"{insp.keys.partitions} partitions"))
    workers = insp.workers()
    if workers:
        out.append(Finding("workers", "ok", f"{len(workers)} live worker(s)"))
    else:
        out.append(Finding("workers", "info", "no live worker", "run `duetime worker --app ...`"))
    ov = insp.overview(queues=[])
    if ov.uncertain:
        out.append(Finding("uncertain", "warn", f"{ov.uncertain} uncertain run(s) await a decision",
                           "`duetime uncertain list`, then `duetime uncertain resolve`"))
    if ov.dead:
        out.append(Finding("dead letters", "info", f"{ov.dead} dead-lettered run(s)",
                           "`duetime dead list`; replay or purge them"))
    return out


def _reason(r: Any) -> str:
    if isinstance(r, Exception):
        return "its key is damaged"
    return str((r or b"").decode(errors="replace")[:120])


def check_schedules(client: redis.Redis, keys: Keyspace) -> list[Finding]:
    """Schedules the evaluator set aside (their record cannot be evaluated): read from the
    partitions' quarantine indexes, never a scan."""
    pipe = client.pipeline(transaction=False)
    for p in range(keys.partitions):
        pipe.zrange(keys.quarantine(p), 0, 4)
    names = [n.decode(errors="replace") for found in pipe.execute(raise_on_error=False)
             if not isinstance(found, Exception) for n in found]
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for n in names[:5]:
        pipe.hget(keys.sched(keys.partition_of_schedule(n), n), "quarantined")
    reasons = [f"{n} ({_reason(r)})"
               for n, r in zip(names[:5], pipe.execute(raise_on_error=False), strict=True)]
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return [Finding("schedules", "warn", f"quarantined schedule(s), not firing: "
                    f"{'; '.join(reasons)}{more}",
                    "fix the definition and register each again (app.schedule or "
                    "`duetime schedule add`); `duetime schedule list` marks them")]


# the per-partition index keys and the type the scripts need them to be
INDEX_TYPES = (("leases", "zset"), ("deadlines", "zset"), ("dead", "zset"), ("uncertain", "zset"),
               ("done", "zset"), ("sched_due", "zset"), ("schedules", "zset"),
               ("scheds", "hash"),
               ("quarantine", "zset"), ("events", "stream"), ("limits", "hash"))
# of these, the ones whose scores are times (an edited +-inf is no time)
TIMED = ("leases", "deadlines", "sched_due")


def check_damaged(client: redis.Redis, keys: Keyspace, insp: Inspector | None = None,
                  queues: list[str] | None = None) -> list[Finding]:
    """Keys no duetime script would have written: an index of the wrong type (the scripts
    refuse to write its partition), a time score of +-inf, and whatever key a listing met
    damaged (`insp.damaged`). One finding per key, naming it; reads only, never a scan."""
    pipe = client.pipeline(transaction=False)
    plan: list[tuple[str, str, str]] = []  # (key, what, wanted)
    for p in range(keys.partitions):
        for kind, want in INDEX_TYPES:
            key = getattr(keys, kind)(p)
            pipe.type(key)
            plan.append((key, "type", want))
        for q in queues or []:
            for key in (keys.due(p, q), keys.retry(p, q)):
                pipe.type(key)
                plan.append((key, "type", "zset"))
        for kind in TIMED:
            key = getattr(keys, kind)(p)
            for op in (pipe.zrange, pipe.zrevrange):
                op(key, 0, 0, withscores=True)
                plan.append((key, "score", kind))
    found: dict[str, str] = {}
    for (key, what, want), res in zip(plan, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(res, Exception):
            continue  # a wrong type, reported by its type check
        if what == "type":
            t = res.decode() if isinstance(res, bytes) else str(res)
            if t not in ("none", want):
                found[key] = f"is a {t}, not a {want}"
        elif res and res[0][1] in (float("inf"), float("-inf")) and not (
                want == "sched_due" and res[0][1] == float("inf")):  # +inf: not due (paused)
            found.setdefault(key, f"member {res[0][0].decode(errors='replace')!r} has score "
                             f"{res[0][1]} (not a time)")
    for key, why in (insp.damaged.items() if insp is not None else ()):
        found.setdefault(key, why)
    return [Finding("damaged key", "warn", f"{key} {why}",
                    "runs and schedules of this key are set aside until it is repaired (delete "
                    "or restore it); everything else goes on") for key, why in sorted(found.items())]


SURGE_HORIZON_MS = 3_600_000  # doctor looks one hour ahead; `schedule lint` a day
SURGE_MAX_SCHEDULES = 50_000  # beyond this, doctor leaves the profile to `schedule lint`


def check_surges(client: redis.Redis, keys: Keyspace, url: str) -> list[Finding]:
    """The busiest second of the next hour against what the live workers can start at once
    (their total concurrency; 100 when none is live): one line, from `schedule lint`'s code."""
    pipe = client.pipeline(transaction=False)
    for p in range(keys.partitions):
        pipe.hlen(keys.scheds(p))  # packed records, and those written before that layout
        pipe.zcard(keys.schedules(p))
    total = sum(pipe.execute())
    if not total:
        return []
    if total > SURGE_MAX_SCHEDULES:
        return [Finding("surges", "info", f"{total} schedules: not profiled here",
                        "`duetime schedule lint` counts runs per second and suggests a stagger")]
    insp = Inspector(client, keys, url)
    capacity = sum(w.concurrency for w in insp.workers() if w.live)
    target = capacity or DEFAULT_MAX_PER_SECOND
    source = "the live workers' concurrency" if capacity else "no live worker: the default"
    store = ScheduleStore(client, keys, url)
    scheds, _, _ = lint_schedules(store)
    prof = profile(scheds, insp.now_ms(), SURGE_HORIZON_MS, max_per_second=target,
                   policy_ms=store.stagger_policy(), top=1, examples=3)
    if prof.flat:
        return [Finding("surges", "ok", f"no second of the next hour has more than {target} "
                        f"runs due (busiest: {prof.peak})")]
    hot = prof.hot[0]
    at = time.strftime("%H:%M:%SZ", time.gmtime(hot.second_ms / 1000))
    return [Finding("surges", "warn", f"{hot.count} runs due in one second at {at} (target "
                    f"{target}, {source}); {prof.over} second(s) of the next hour above it",
                    "`duetime schedule lint` names the schedules and the stagger that spreads "
                    "them (`duetime schedule policy set --stagger ...`)")]


def check_paused_queues(client: redis.Redis, keys: Keyspace, url: str) -> list[Finding]:
    """One line per paused queue: its runs are accepted and wait, and none is claimed."""
    from duetime.client.pause import QueuePauses

    return [Finding("queue paused", "warn",
                    f"queue {p.queue!r} is paused" + (f" ({p.note})" if p.note else "")
                    + ": runs enqueued to it wait, none is claimed",
                    f"duetime queue resume {p.queue}")
            for p in QueuePauses(client, keys, url).list()]


def check_tls(url: str) -> list[Finding]:
    """A `rediss://` URL that turns certificate or host name verification off: encrypted,
    but anyone on the path can pose as the server."""
    scheme = url.split("://", 1)[0]
    if scheme not in ("rediss", "rediss+cluster"):
        return []
    query = {k.lower(): v.lower() for k, v in parse_qsl(urlsplit(url).query)}
    off = []
    if query.get("ssl_cert_reqs") in ("none", "optional"):
        off.append(f"ssl_cert_reqs={query['ssl_cert_reqs']}")
    if query.get("ssl_check_hostname") in ("false", "0", "no", "off", "f", "n"):
        off.append(f"ssl_check_hostname={query['ssl_check_hostname']}")
    if off:
        return [Finding("tls", "warn", f"TLS without certificate verification ({', '.join(off)}): "
                        "anyone on the network path can pose as the server and read or change "
                        "every run", "drop that option from the URL and give the server's CA "
                        "with ssl_ca_certs=/path/ca.crt")]
    return [Finding("tls", "ok", "TLS with the server's certificate and name verified")]


def run_checks(client: redis.Redis, keys: Keyspace, url: str,
               configured_partitions: int | None = None, surges: bool = False) -> list[Finding]:
    """Every check; a server that cannot be reached is itself a fatal finding. `surges`: also
    profile the next hour of schedules (reads every schedule: the CLI's doctor, not the web
    console's refreshing overview)."""
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        from duetime.common.connection import unavailable

        return [Finding("connection", "fatal", str(unavailable(url, exc)),
                        "check the URL, the network and the server")]
    findings: list[Finding] = []
    insp = Inspector(client, keys, url)
    checks: list[Callable[[], list[Finding]]] = [
        lambda: check_server(client), lambda: check_memory(client),
        lambda: check_persistence(client), lambda: check_cluster(client),
        lambda: check_clock(client), lambda: check_tls(url),
        lambda: check_partitions(client, keys, configured_partitions),
        lambda: check_processes(insp),
        lambda: check_schedules(client, keys),
        lambda: check_damaged(client, keys, insp, insp.queues()),
        lambda: check_paused_queues(client, keys, url),
    ]
    if surges:
        checks.append(lambda: check_surges(client, keys, url))
    for check in checks:
        try:
            findings += check()
        except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable) as exc:
            findings.append(Finding("connection", "fatal", f"lost the server mid-check: {exc}"))
            break
        except (redis.ResponseError, RedisRefused) as exc:
            # one check refused (a damaged key it reads): said, and the other checks go on
            findings.append(Finding("check failed", "warn", f"a check could not finish: {exc}",
                                    "`duetime doctor` lists the damaged keys it found below"))
    return findings
