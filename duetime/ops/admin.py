"""Operator actions on runs: cancel, replay, resolve an uncertain run, purge dead letters.

Each action is one Lua transition on one partition (see `lua/cancel.lua`, `replay.lua`,
`resolve.lua`, `purge.lua`), so an interrupted bulk action leaves every run it touched in a
consistent state, and running it again continues where it stopped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import redis

from duetime.common import transitions as tr
from duetime.common.connection import translated
from duetime.common.errors import InvalidInput, InvalidState, RunNotFound
from duetime.common.keys import Keyspace, stable_hash
from duetime.common.models import DEFAULT_QUEUE
from duetime.common.names import check_name
from duetime.common.scripts import Scripts

PURGE_BATCH = 500
VERDICTS = ("succeeded", "failed", "replay")


def replay_id(keys: Keyspace, old_id: str) -> str:
    """A fresh run id in the old run's partition (one script must touch both records).

    A schedule's run keeps the schedule's name before `@` (that is what places it); an ad-hoc
    run's id is drawn until it hashes to the same partition (P tries on average)."""
    if "@" in old_id:
        return f"{old_id.rsplit('@', 1)[0]}@r{os.urandom(6).hex()}"
    p = keys.partition_of_run(old_id)
    while True:
        candidate = os.urandom(10).hex()
        if stable_hash(candidate) % keys.partitions == p:
            return candidate


class RunAdmin:
    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url
        self.scripts = Scripts(client)

    def _where(self, run_id: str) -> tuple[int, str]:
        """→ (partition, queue) of an existing run; RunNotFound otherwise."""
        check_name("run id", run_id)
        p = self.keys.partition_of_run(run_id)
        with translated(self.url):
            # replies are bytes: no duetime client sets decode_responses
            state, queue = cast(list[bytes | None],
                                self.client.hmget(self.keys.run(p, run_id), "state", "queue"))
        if state is None:
            raise self._missing(run_id)
        return p, queue.decode() if queue is not None else DEFAULT_QUEUE  # absent: format 3

    def _missing(self, run_id: str) -> RunNotFound:
        return RunNotFound(f"no run {run_id!r} in namespace {self.keys.namespace!r}")

    def _call(self, run_id: str, script: Any, call: tr.Call) -> tuple[str, str]:
        """A status script's (word, value) about `run_id`; a run gone meanwhile is RunNotFound."""
        keys, args = call
        with translated(self.url):
            status, detail = tr.status_detail(script(keys=keys, args=args))
        if status == "missing":
            raise self._missing(run_id)
        return status, detail

    def cancel(self, run_id: str, reason: str = "cancelled by an operator") -> tuple[str, str]:
        """→ ('cancelled', previous state) or ('requested', worker id) for a running run."""
        p, queue = self._where(run_id)
        status, detail = self._call(run_id, self.scripts.cancel,
                                    tr.cancel(self.keys, p, queue, run_id, reason))
        if status == "uncertain":
            raise InvalidState(f"run {run_id} is uncertain (outcome unknown): decide with "
                               f"`duetime uncertain resolve {run_id} --as succeeded|failed|replay`")
        if status == "finished":
            raise InvalidState(f"run {run_id} has already finished ({detail}); nothing to cancel")
        return status, detail

    def replay(self, run_id: str, force: bool = False, note: str = "") -> tuple[str, bool]:
        """→ (the replay's run id, created now?). A run already replayed gives its replay."""
        p, queue = self._where(run_id)
        new_id = replay_id(self.keys, run_id)
        status, detail = self._call(run_id, self.scripts.replay,
                                    tr.replay(self.keys, p, queue, run_id, new_id, force, note))
        if status == "active":
            raise InvalidState(f"run {run_id} is still {detail}; only finished runs are replayed "
                               f"(cancel it first: `duetime runs cancel {run_id}`)")
        if status == "succeeded":
            raise InvalidState(f"run {run_id} succeeded; replaying it runs the work again: "
                               "add --force if that is what you want")
        return detail, status == "created"

    def resolve(self, run_id: str, verdict: str, note: str = "") -> str:
        """An uncertain run's verdict → the run's new state, or the replay's run id."""
        if verdict not in VERDICTS:
            raise InvalidInput(f"verdict must be one of {', '.join(VERDICTS)}; got {verdict!r}")
        p, _ = self._where(run_id)
        state = cast(bytes | None, self.client.hget(self.keys.run(p, run_id), "state"))
        if state != b"uncertain":
            raise InvalidState(f"run {run_id} is not uncertain (state "
                               f"{state.decode() if state else 'gone'}); nothing to resolve")
        if verdict == "replay":
            return self.replay(run_id, note=note)[0]
        status, detail = self._call(run_id, self.scripts.resolve,
                                    tr.resolve(self.keys, p, run_id, verdict, note))
        if status == "not_uncertain":
            raise InvalidState(f"run {run_id} is not uncertain (state {detail}); nothing to resolve")
        return detail

    def count_dead(self, before_ms: int | None = None) -> int:
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.zcount(self.keys.dead(p), "-inf", "+inf" if before_ms is None else before_ms)
        with translated(self.url):
            return sum(pipe.execute())

    def purge_dead(self, before_ms: int | None = None,
                   progress: Callable[[int], None] | None = None) -> int:
        """Delete dead-lettered runs (all, or dead at or before `before_ms`) → how many."""
        total = 0
        for p in range(self.keys.partitions):
            while True:
                keys, args = tr.purge(self.keys, p, PURGE_BATCH, before_ms)
                with translated(self.url):
                    purged, examined = tr.counts(self.scripts.purge(keys=keys, args=args))
                total += purged
                if progress:
                    progress(examined)
                if examined < PURGE_BATCH:
                    break
        return total

    def delete_dead(self, run_ids: list[str]) -> int:
        """Delete these dead letters for good (purge.lua, by id) → how many were; a run not
        dead-lettered any more (replayed, purged, never dead) is left alone."""
        by_partition: dict[int, list[str]] = {}
        for run_id in dict.fromkeys(run_ids):
            check_name("run id", run_id)
            by_partition.setdefault(self.keys.partition_of_run(run_id), []).append(run_id)
        total = 0
        for p, ids in sorted(by_partition.items()):
            for i in range(0, len(ids), PURGE_BATCH):
                keys, args = tr.purge(self.keys, p, PURGE_BATCH, None, ids[i:i + PURGE_BATCH])
                with translated(self.url):
                    total += tr.counts(self.scripts.purge(keys=keys, args=args))[0]
        return total
