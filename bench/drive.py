"""The scripts driven by hand, as the script-cost benchmarks do it (no worker): claim every
run, then complete them, a batch per call; the benchmarks measure Redis CPU around each phase."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from duetime.common import transitions as tr
from duetime.common.keys import Keyspace

Held = dict[int, list[tuple[Any, ...]]]  # partition -> (run id, fence, ...) claimed there
Script = Callable[..., Any]  # a script object: script(keys=..., args=...)


def fences(res: Any) -> list[tuple[str, int]]:
    """(run id, fence) of each run of a claim reply."""
    return [(c.run_id, c.fence) for c in tr.parse_claim(res).runs]


def claim_all(k: Keyspace, claim: Script, batch: int, lease_ms: int, n: int,
              decode: Callable[[Any], list[Any]] = fences) -> Held:
    """Claim every run of the queue 'default', partition by partition, `batch` per call,
    with `claim`; `n` runs must have been claimed (an assertion, for a benchmark)."""
    held: Held = {}
    for p in range(k.partitions):
        while True:
            keys, args = tr.claim(k, p, "default", "bench:1", batch, lease_ms)
            runs = decode(claim(keys=keys, args=args))
            if not runs:
                break
            held.setdefault(p, []).extend(runs)
    assert sum(len(v) for v in held.values()) == n, "not every run was claimed"
    return held


def complete_all(k: Keyspace, complete: Script, held: Held, batch: int) -> None:
    """Complete every claimed run, `batch` per call."""
    for p, items in held.items():
        for i in range(0, len(items), batch):
            keys, args = tr.complete(k, p, items[i : i + batch])
            complete(keys=keys, args=args)


def repeated(args: argparse.Namespace, one_round: Callable[[str], dict[str, float]],
             header: str) -> None:
    """`args.repeat` rounds of `one_round(url)` on one embedded `args.server`, then `header`
    and the rounds with their medians."""
    from bench.stats import print_rounds
    from duetime.embedded import EmbeddedServer

    with EmbeddedServer(args.server) as server:
        rounds = [one_round(server.url) for _ in range(args.repeat)]
    print(header)
    print_rounds(rounds)


def parser(**defaults: int | float) -> argparse.ArgumentParser:
    """A benchmark's command line: `--<name>` for each default (of the default's type), then
    --server (redis or valkey)."""
    ap = argparse.ArgumentParser()
    for name, default in defaults.items():
        ap.add_argument(f"--{name}", type=type(default), default=default)
    ap.add_argument("--server", choices=["redis", "valkey"], default="redis")
    return ap
