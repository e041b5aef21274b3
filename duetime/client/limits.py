"""Concurrency and rate limits per tenant, queue and task, enforced by claim.lua.

A claim touches one partition (one cluster slot), so the limits it checks must live there:
`<ns>:limits` keeps each limit as set (for listing), and every partition's `T:limits` hash
holds that partition's share of it, which claim.lua reads. Shares (docs/fairness.md):

- a tenant's enqueued runs all live in its home partition, so a tenant limit is copied
  whole into every partition: exact for those runs;
- a queue or a task spans every partition, so its concurrency is split into per-partition
  shares summing to the limit (at least 1 each), and its rate into rate / P per partition.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis

from duetime.common import limit_fields
from duetime.common.connection import translated
from duetime.common.errors import DamagedState, InvalidInput
from duetime.common.keys import Keyspace
from duetime.common.limit_fields import KINDS
from duetime.common.names import check_name
from duetime.common.time.parse import Span, duration_ms

PER = Span(timedelta(milliseconds=1), timedelta(days=1))
MAX_CONCURRENCY = 1_000_000
MAX_WEIGHT = 1000


@dataclass(frozen=True)
class Limit:
    """One limit as set: at most `concurrency` running at once, and at most `rate` starts per
    `per_ms` with bursts up to `burst` (None: no such limit)."""

    kind: str
    name: str
    concurrency: int | None = None
    rate: float | None = None
    per_ms: int = 1000
    burst: float | None = None
    weight: int | None = None  # a tenant's share of claims against others in its lanes

    @property
    def scope(self) -> str:
        return limit_fields.scope(self.kind, self.name)

    def to_json(self) -> str:
        return json.dumps({"concurrency": self.concurrency, "rate": self.rate,
                           "per_ms": self.per_ms, "burst": self.burst, "weight": self.weight},
                          sort_keys=True)

    @classmethod
    def from_json(cls, scope: bytes | str, raw: bytes | str, key: str = "the limits hash") -> Limit:
        """A limit as stored in `<ns>:limits`; a field no duetime process writes (edited by
        hand) is refused with DamagedState naming the key and field."""
        scope = scope.decode(errors="replace") if isinstance(scope, bytes) else scope
        kind, _, name = scope.partition(":")

        def bad(why: str) -> DamagedState:
            return DamagedState(f"{key} field {scope!r}: {why} (set the limit again with "
                                f"`duetime limits set`, or HDEL {key} {scope})")

        if kind not in KINDS or not name:
            raise bad(f"not a <{'|'.join(KINDS)}>:<name> scope")
        try:
            o = json.loads(raw)
        except ValueError:
            raise bad(f"value {raw[:40]!r} is not JSON") from None
        if not isinstance(o, dict):
            raise bad(f"value {raw[:40]!r} is not a JSON object")

        def number(field: str, lo: float, hi: float, integer: bool) -> Any:
            v = o.get(field)
            if v is None:
                return None
            ok = isinstance(v, int) if integer else isinstance(v, int | float)
            if isinstance(v, bool) or not ok or not (lo <= v <= hi):
                raise bad(f"{field} is {v!r}, not a {'whole ' if integer else ''}number in {lo}..{hi}")
            return v

        per_ms = number("per_ms", 1, PER.hi / timedelta(milliseconds=1), True)
        return cls(kind, name, number("concurrency", 1, MAX_CONCURRENCY, True),
                   number("rate", 0, 1e12, False), int(per_ms or 1000),
                   number("burst", 0, 1e12, False), number("weight", 1, MAX_WEIGHT, True))

    def shares(self, partitions: int) -> list[dict[str, str]]:
        """This limit's T:limits fields in each partition (see the module docstring)."""
        out: list[dict[str, str]] = []
        whole = self.kind == "tenant"
        for p in range(partitions):
            f: dict[str, str] = {}
            if self.concurrency is not None:
                n = self.concurrency
                if not whole:
                    n = n // partitions + (1 if p < n % partitions else 0)
                f[limit_fields.field(self.scope, "concurrency")] = str(max(1, n))
            if self.rate is not None:
                per_ms = self.rate / self.per_ms
                burst = self.burst if self.burst is not None else max(1.0, self.rate)
                if not whole:
                    per_ms, burst = per_ms / partitions, max(1.0, burst / partitions)
                f[limit_fields.field(self.scope, "rate")] = f"{per_ms!r} {burst!r}"
            if self.weight is not None:
                f[limit_fields.field(self.scope, "weight")] = str(self.weight)
            out.append(f)
        return out


def make_limit(kind: str, name: str, concurrency: int | None = None, rate: float | None = None,
               per: timedelta | float | str = 1.0, burst: float | None = None,
               weight: int | None = None) -> Limit:
    """A validated limit (InvalidInput says what is wrong)."""
    if kind not in KINDS:
        raise InvalidInput(f"limit kind must be one of {', '.join(KINDS)}; got {kind!r}")
    check_name("task name" if kind == "task" else kind, name)
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or not 1 <= concurrency <= MAX_CONCURRENCY):
        raise InvalidInput(f"concurrency must be an integer in 1..{MAX_CONCURRENCY}, "
                           f"got {concurrency!r}")
    per_ms = duration_ms(PER.parse(per, "per"))
    for what, v in (("rate", rate), ("burst", burst)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not math.isfinite(v) or v <= 0):
            raise InvalidInput(f"{what} must be a positive number, got {v!r}")
    if burst is not None and rate is None:
        raise InvalidInput("burst needs a rate")
    if burst is not None and burst < 1:
        raise InvalidInput(f"burst must be at least 1, got {burst!r}")
    if weight is not None:
        if kind != "tenant":
            raise InvalidInput("a weight applies to a tenant (its share in the claim's round robin)")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise InvalidInput(f"weight must be an integer in 1..{MAX_WEIGHT}, got {weight!r}")
    return Limit(kind, name, concurrency, None if rate is None else float(rate), per_ms,
                 None if burst is None else float(burst), weight)


class Limits:
    """Set, clear and list the limits of a namespace."""

    def __init__(self, client: redis.Redis, keys: Keyspace, url: str) -> None:
        self.client, self.keys, self.url = client, keys, url

    def set(self, limit: Limit) -> None:
        """Replace the limit of (kind, name); one with no concurrency, rate or weight clears it.
        Every partition's share is written in one pipeline; each partition's claims see the
        old or the new share, never a mix within one claim."""
        k = self.keys
        fields = limit_fields.fields(limit.scope)
        pipe = self.client.pipeline(transaction=False)
        for p, share in enumerate(limit.shares(k.partitions)):
            gone = [f for f in fields if f not in share]
            if share:
                # redis-py wants a Mapping keyed by exactly FieldT (invariant in its key type)
                pipe.hset(k.limits(p), mapping=share)  # type: ignore[arg-type]
            if gone:
                pipe.hdel(k.limits(p), *gone)
        if limit.concurrency is None and limit.rate is None and limit.weight is None:
            pipe.hdel(k.limit_config, limit.scope)
        else:
            pipe.hset(k.limit_config, limit.scope, limit.to_json())
        with translated(self.url):
            pipe.execute()

    def clear(self, kind: str, name: str) -> None:
        self.set(make_limit(kind, name))

    def list(self) -> list[Limit]:
        with translated(self.url):
            raw: dict[Any, Any] = self.client.hgetall(self.keys.limit_config)
        return sorted((Limit.from_json(s, v, self.keys.limit_config) for s, v in raw.items()),
                      key=lambda lim: (lim.kind, lim.name))
