"""Redis commands per relayed dependency notice: the reaper's relay (scheduler/relay.py) driven
by hand, as its wake-channel listener would drive it, on one embedded server. Counts, not
time: the commands the server executed (`INFO commandstats`, those inside the scripts
included) and the commands the relay sent (the `tot-cmds` of its connections in `CLIENT
LIST`), per notice applied.

Each pair is a dependency `a` (one partition) and a run `b` waiting on it in another; `a` is
cancelled, which leaves the notice in a's partition's T:depnotes and publishes `r|<partition>`;
the relay is told of each partition so published and makes passes until nothing is left.

- `single`: one pair ended and relayed at a time (a run ending now and then: a pass per notice)
- `burst`: every pair ended, then relayed (a batch of runs ending at once)

    .venv/bin/python -m bench.relay_cost [--pairs 200] [--burst 2000] [--server redis]
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from duetime.common.wake import parse_scheduler_notice
from duetime.scheduler.reaper import Reaper

from bench.apps import app, noop
from bench.drive import parser
from duetime.client.runs import EnqueueRequest
from duetime.embedded import EmbeddedServer

OWN = ("info", "client|list", "client|id", "subscribe", "ping")  # the bench's own commands
# a new connection's handshake (the scripts loaded on it): once per connection, not per notice
HANDSHAKE = ("hello", "client|setinfo", "script|load", "select")


class Sent:
    """Counts the commands this process sends while `on` (redis-py's sync connections: one
    `send_command` per direct command, `pack_commands` for a pipeline's), handshakes left out."""

    def __init__(self) -> None:
        self.on = False
        self.n = 0
        conn = redis.connection.AbstractConnection
        send, pack = conn.send_command, conn.pack_commands
        counter = self

        def counted(cmds: Any) -> int:
            return sum(1 for c in cmds if str(c[0]).upper() not in ("HELLO", "CLIENT", "SCRIPT", "SELECT"))

        def send_command(self: Any, *args: Any, **kw: Any) -> Any:
            if counter.on:
                counter.n += counted([args])
            return send(self, *args, **kw)

        def pack_commands(self: Any, commands: Any) -> Any:
            if counter.on:
                commands = list(commands)
                counter.n += counted(commands)
            return pack(self, commands)

        conn.send_command = send_command  # type: ignore[method-assign]
        conn.pack_commands = pack_commands  # type: ignore[method-assign]


SENT = Sent()


class Counter:
    """Commands executed between two `take`s, the bench's own left out."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.executed: dict[str, int] = {}
        self._last = self._read()

    def _read(self) -> dict[str, int]:
        return {k.removeprefix("cmdstat_"): int(v["calls"])
                for k, v in self.r.info("commandstats").items()}

    def take(self) -> None:
        """Add what was counted since the last call."""
        stats, stats0 = self._read(), self._last
        for name, calls in stats.items():
            d = calls - stats0.get(name, 0)
            if d and name not in OWN + HANDSHAKE:
                self.executed[name] = self.executed.get(name, 0) + d
        self._last = self._read()

    def skip(self) -> None:
        """Leave out what happened since the last call (the bench's own setup)."""
        self._last = self._read()


def _pairs(n: int) -> list[tuple[str, str]]:
    """n dependencies, each with one waiting run in another partition."""
    k, spec = app.keys, app.registry.resolve(noop)
    tag = uuid.uuid4().hex[:6]
    out, reqs_a, reqs_b = [], [], []
    for i in range(n):
        a = f"a{tag}{i}"
        b = next(f"b{tag}{i}x{j}" for j in range(1000)
                 if k.partition_of_run(f"b{tag}{i}x{j}") != k.partition_of_run(a))
        out.append((a, b))
        reqs_a.append(EnqueueRequest(spec, [i], run_id=a, delay=3600))
        reqs_b.append(EnqueueRequest(spec, [i], run_id=b, depends_on=(a,)))
    app.store.enqueue_many(reqs_a)
    app.store.enqueue_many(reqs_b)
    return out


def _told(sub: Any) -> set[int]:
    """The partitions named by the relay notices waiting on the subscription."""
    told = set()
    while (m := sub.get_message(timeout=0.2)) is not None:
        if m["type"] == "message" and (n := parse_scheduler_notice(m["data"])) and n[0] == "r":
            told.add(n[1])
    return told


def _drain(reaper: Reaper, told: set[int]) -> tuple[int, int]:
    """Relay passes until one applies nothing and nothing is left to read: (applied, passes)."""
    for p in told:
        reaper.told_relay(p)
    applied = passes = 0
    SENT.on = True
    try:
        while True:
            n = reaper.relay_once()
            passes += 1
            applied += n
            if n == 0 and not reaper._relay_told:
                return applied, passes
    finally:
        SENT.on = False


def run(url: str, pairs: int, burst: int) -> None:
    app.configure(redis_url=url, namespace=f"rc{uuid.uuid4().hex[:6]}")
    app.store.ready()
    r = redis.Redis.from_url(url)
    reaper = Reaper(url, app.keys)
    reaper._relayed_all_at = time.monotonic()  # no safety read in the window
    sub = r.pubsub()
    sub.subscribe(app.keys.sched_wake)
    assert sub.get_message(timeout=10)["type"] == "subscribe"
    try:
        for name, n, one_by_one in (("single", pairs, True), ("burst", burst, False)):
            made = _pairs(n)
            c = Counter(r)
            applied = passes = 0
            sent0 = SENT.n
            groups = [[x] for x in made] if one_by_one else [made]
            for group in groups:
                c.skip()
                for a, _ in group:
                    app.cancel(a)
                told = _told(sub)
                c.skip()
                got, ps = _drain(reaper, told)
                c.take()
                applied, passes = applied + got, passes + ps
            states = {app.get_run(b).state for _, b in made}
            assert applied == n and states == {"cancelled"}, (applied, states)
            top = ", ".join(f"{k} {v / n:.2f}" for k, v in
                            sorted(c.executed.items(), key=lambda kv: -kv[1]))
            print(f"{name}: {n} notices in {passes} passes: "
                  f"{(SENT.n - sent0) / n:.2f} commands sent per notice, "
                  f"{sum(c.executed.values()) / n:.2f} executed ({top})")
    finally:
        sub.close()
        reaper.close()


def main() -> None:
    from duetime.common.logs import configure

    configure("WARNING")
    p = parser(pairs=200, burst=2000)
    args = p.parse_args()
    with EmbeddedServer(args.server) as server:
        run(server.url, args.pairs, args.burst)


if __name__ == "__main__":
    main()
