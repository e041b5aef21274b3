"""Many replicas declaring the same schedules: 8 processes upsert the same 200 schedules
concurrently at start-up, killed and restarted at random, round after round, some rounds with
a changed definition, while two evaluators materialise runs. Then: exactly one run per
occurrence (no gap, no double, on each schedule's 1 s grid), the last definition wins, no
schedule duplicated, lost, left paused, quarantined or without a cursor.

`make soak` runs it at its issue's size, 1,000 rounds; CI at 250. The definitions change every
50 rounds (tests/integration/upsert_replica.py), so 250 rounds go through every change of
variant (0 to 1, 1 to 2, 2 back to 0) at least once, each raced by 8 replicas and cut by the
random kills, which go on for the whole of the rounds either way: the interleavings are those
of the long run, fewer times over.

Runtime is bounded by the rounds (about 10 s at 250 on a busy machine); waits use deadlines."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time

import pytest
from duetime.common.codec import unpack_payload
from duetime.common.schedules import same_definition, unpack_record
from duetime.scheduler.evaluator import Evaluator

import duetime
from tests import schedrec
from tests.conftest import ROOT, SOAK, wait_for
from tests.integration.upsert_replica import FINAL, N
from tests.integration.upsert_replica import defs as declared

ROUNDS = 1000 if SOAK else 250
REPLICAS = 8
CHAOS_S = 20.0


def _replica(procs, url: str, namespace: str, *extra: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "tests.integration.upsert_replica", url,
                          namespace, str(ROUNDS), *extra], env=procs.env(), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.procs.append(p)
    return p


@pytest.mark.scripts(memory="needs processes")
def test_eight_replicas_upserting_200_schedules_round_after_round(app, url, namespace, procs):
    k, r = app.keys, app.store.client
    stop = threading.Event()
    errors: list[BaseException] = []

    def evaluate() -> None:
        ev = Evaluator(url, k, lead_ms=1000, tick_s=0.05)
        try:
            while not stop.is_set():
                ev.tick()
                stop.wait(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            ev.client.close()

    evaluators = [threading.Thread(target=evaluate, daemon=True) for _ in range(2)]
    for t in evaluators:
        t.start()
    rng = random.Random(7)
    fleet = [_replica(procs, url, namespace) for _ in range(REPLICAS)]
    kills = 0
    counter = f"{namespace}:test:rounds"
    # replicas are killed at random for CHAOS_S at most (process start-ups dominate on a busy
    # machine); then the ones alive finish the rounds left
    chaos_until = time.monotonic() + CHAOS_S
    while int(r.get(counter) or 0) < ROUNDS and time.monotonic() < chaos_until:
        time.sleep(rng.uniform(0.3, 1.2))  # pacing of the chaos, not a wait for a result
        i = rng.randrange(REPLICAS)
        if fleet[i].poll() is None:
            fleet[i].send_signal(signal.SIGKILL)  # mid-upsert, at random
            kills += 1
        fleet[i].wait()
        fleet[i] = _replica(procs, url, namespace)
    for p in fleet:  # the ones alive finish the rounds left
        assert p.wait(timeout=120) in (0, -signal.SIGKILL), _err(p)
    if int(r.get(counter) or 0) < ROUNDS:
        assert _replica(procs, url, namespace).wait(timeout=120) == 0
    assert int(r.get(counter) or 0) >= ROUNDS and kills > 0
    # the deploy settles: two replicas declare the final definitions (not killed)
    last = [_replica(procs, url, namespace, "3") for _ in range(2)]
    for p in last:
        assert p.wait(timeout=120) == 0, _err(p)
    # runs go on being made under the final definitions a little while
    settled = {}
    for i in range(N):
        name = f"cu-{i:03d}"
        settled[name] = int(schedrec.field(r, k, name, "next_ms") or 0)
    wait_for(lambda: all(int(schedrec.field(r, k, n, "last_ms") or 0)
                         > settled[n] for n in settled), timeout=60)
    stop.set()
    for t in evaluators:
        t.join(30)
    assert not errors, errors

    # the definitions of the final rounds, made as the replicas make them
    mirror = duetime.App(redis_url=url, namespace=namespace)

    @mirror.task(name="cu.noop")
    def noop(v: int = 0) -> None: ...

    final = {d.name: d for d in declared(mirror, noop, FINAL)}
    mirror.close()
    assert int(r.get(f"{namespace}:test:dup_versions") or 0) == 0
    names = []
    for p in range(k.partitions):
        names += [n.decode() for n in r.hkeys(k.scheds(p))]  # the packed records
        assert r.zcard(k.quarantine(p)) == 0
    assert sorted(names) == [f"cu-{i:03d}" for i in range(N)]  # none lost, none twice
    for name in names:
        p = k.partition_of_schedule(name)
        s = {f.decode(): v for f, v in schedrec.record(r, k, name).items()}
        assert s["paused"] == b"0" and "quarantined" not in s, name
        assert s.get("next_ms") and r.zscore(k.sched_due(p), name) is not None, name
        # the last definition wins: the stored one is the final rounds' definition, and the
        # write that made its version (when its replica lived to report it) wrote just that
        assert same_definition(unpack_record(r.hget(k.scheds(p), name)), name,
                               final[name].fields()), name
        wrote = r.hget(f"{namespace}:test:wrote:{name}", s["version"].decode())
        assert wrote is None or wrote.decode() == final[name].def_hash(), name
        _, kwargs = unpack_payload(s["payload"])
        assert kwargs == ({"v": FINAL} if int(name[3:]) % 4 == 0 else {}), name
        # exactly one run per occurrence: consecutive seconds from the first to the last
        occs = sorted(int(x.decode().rsplit("@", 1)[1]) for x in r.zrange(k.due(p, "default"), 0, -1)
                      if x.decode().rsplit("@", 1)[0] == name)
        assert occs, name
        assert occs == list(range(occs[0], occs[-1] + 1000, 1000)), (name, _gaps(occs))
        assert occs[-1] == int(s["last_ms"]), name


def _err(p: subprocess.Popen[bytes]) -> str:
    return p.stderr.read().decode()[-2000:] if p.stderr else ""


def _gaps(occs: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in zip(occs, occs[1:], strict=False) if b - a != 1000][:5]
