"""Shared by the long-run tests (checkpoints, progress, Continue): the app bound to the
test's server and namespace, and the scripts driven directly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts

from tests.apps import longruns


@pytest.fixture
def lapp(url: str, namespace: str) -> Iterator[Any]:
    longruns.app.configure(redis_url=url, namespace=namespace)
    longruns.seen.clear()
    longruns.gates.clear()
    yield longruns.app
    for gate in longruns.gates.values():  # never leave a task thread waiting
        gate.set()
    longruns.app.close()


class Scripted:
    """Claims, reaps and checkpoints through the real scripts, as a worker or the reaper would."""

    def __init__(self, app: Any) -> None:
        self.app, self.k = app, app.keys
        self.r = app.store.ready()
        self.scripts = Scripts(self.r)

    def claim(self, worker: str, queue: str = "default", lease_ms: int = 60_000) -> list[Any]:
        out = []
        for p in range(self.k.partitions):
            keys, args = tr.claim(self.k, p, queue, worker, 100, lease_ms)
            out += tr.parse_claim(self.scripts.claim(keys=keys, args=args)).runs
        return out

    def expire_and_reap(self, run_id: str) -> None:
        """The lease of `run_id` expires now (not slept through) and the reaper recovers it."""
        p = self.k.partition_of_run(run_id)
        changed = self.r.zadd(self.k.leases(p), {run_id: 0}, xx=True, ch=True)
        assert changed == 1, (run_id, self.r.hgetall(self.k.run(p, run_id)).get(b"state"),
                              self.r.zscore(self.k.leases(p), run_id))
        keys, args = tr.reap(self.k, p, 100, 0.3, 0)
        self.scripts.reap(keys=keys, args=args)

    def checkpoint(self, run_id: str, worker: str, fence: int, state: bytes,
                   cap: int = 64 * 1024) -> str:
        p = self.k.partition_of_run(run_id)
        keys, args = tr.checkpoint(self.k, p, run_id, worker, fence, state, cap)
        return tr.status(self.scripts.checkpoint(keys=keys, args=args)).decode()

    def continue_run(self, run_id: str, fence: int, delay_ms: int = 0,
                     state: bytes | None = None) -> str:
        p = self.k.partition_of_run(run_id)
        keys, args = tr.continue_run(self.k, p, "default", run_id, fence, delay_ms, state,
                                     64 * 1024)
        return tr.status(self.scripts.continue_run(keys=keys, args=args)).decode()

    def heartbeat(self, run_id: str, token: str, progress: str = "") -> list[int]:
        p = self.k.partition_of_run(run_id)
        keys, args = tr.heartbeat(self.k, p, 60_000, [(run_id, token, progress)])
        return list(self.scripts.heartbeat(keys=keys, args=args))

    def field(self, run_id: str, name: str) -> bytes | None:
        p = self.k.partition_of_run(run_id)
        value: bytes | None = self.r.hget(self.k.run(p, run_id), name)
        return value

    def events(self, run_id: str, kind: str) -> list[str]:
        p = self.k.partition_of_run(run_id)
        return [f[b"detail"].decode() for _, f in self.r.xrange(self.k.events(p))
                if f[b"run"] == run_id.encode() and f[b"event"] == kind.encode()]

    def due_now(self, run_id: str, queue: str = "default") -> None:
        """Advance time for one run: due at the server's now (not slept through)."""
        p = self.k.partition_of_run(run_id)
        sec, usec = self.r.time()
        assert self.r.zadd(self.k.due(p, queue), {run_id: sec * 1000 + usec // 1000}, xx=True,
                           ch=True) == 1
