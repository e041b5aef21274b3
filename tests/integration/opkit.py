"""Helpers for the operator tests: run the CLI in-process (click's runner) and put runs into
given states through the real Lua transitions, without waiting for workers."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts

from duetime.cli import main


def cli(url: str, namespace: str, *args: str, input: str | None = None) -> Result:
    """`duetime --redis-url URL --namespace NS ARGS...`, in-process; exceptions propagate."""
    return CliRunner().invoke(main, ["--redis-url", url, "--namespace", namespace, *args],
                              input=input, catch_exceptions=False)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def one_line_error(result: Result, code: int) -> str:
    """A failure must be one clear line on stderr with the expected exit code, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


class Driver:
    """Claims, fails and reaps through the real scripts (what a worker or the reaper does)."""

    def __init__(self, app: Any) -> None:
        self.app, self.k = app, app.keys
        self.r = app.store.ready()
        self.scripts = Scripts(self.r)

    def claim_all(self, queue: str = "default", worker: str = "w-test", lease_ms: int = 60_000):
        out = []
        for p in range(self.k.partitions):
            keys, args = tr.claim(self.k, p, queue, worker, 1000, lease_ms)
            out += [(p, c) for c in tr.parse_claim(self.scripts.claim(keys=keys, args=args)).runs]
        return out

    def fail(self, p: int, c: Any, mode: str = "fatal", error: str = "Fatal: broken",
             delay_ms: int = 0) -> str:
        keys, args = tr.fail(self.k, p, "default", c.run_id, c.fence, error, mode, delay_ms, 0.5)
        return self.scripts.fail(keys=keys, args=args)[0].decode()

    def dead(self, task: Any, n: int, args: list[Any] | None = None) -> list[str]:
        ids = self.app.enqueue_many([(task, args or [])] * n)
        for p, c in self.claim_all():
            assert self.fail(p, c) == "dead"
        return ids

    def succeeded(self, task: Any, n: int, args: list[Any] | None = None) -> list[str]:
        ids = self.app.enqueue_many([(task, args or [])] * n)
        for p, c in self.claim_all():
            keys, args = tr.complete(self.k, p, [(c.run_id, c.fence)])
            assert self.scripts.complete(keys=keys, args=args) == [b"succeeded"]
        return ids

    def uncertain(self, task: Any, n: int) -> list[str]:
        """Non-idempotent runs whose worker vanished: lease expired, reaped."""
        ids = self.app.enqueue_many([(task, [0.0])] * n)
        for p, c in self.claim_all():
            self.r.zadd(self.k.leases(p), {c.run_id: 0})
        for p in range(self.k.partitions):
            keys, args = tr.reap(self.k, p, 100, 0.3, 0)
            self.scripts.reap(keys=keys, args=args)
        return ids
