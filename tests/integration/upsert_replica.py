"""One replica of tests/integration/test_concurrent_upsert.py: declares the same 200
schedules at start-up, round after round, through the public API (`schedule_def` +
`schedule_many`), as every replica of a deployment does, until the shared round counter
reaches its end. Each definition it wrote (created/updated, and the version it got) is
reported so the test can tell which definition the last write was.

    python -m tests.integration.upsert_replica URL NAMESPACE ROUNDS [FINAL_ROUNDS]
"""

from __future__ import annotations

import random
import sys
from datetime import timedelta

import duetime

N = 200
EVERY = duetime.Every(timedelta(seconds=1))
FINAL = 99  # the definition variant of the last rounds


def variant_for(n: int) -> int:
    """Rounds change some definitions: every 50 rounds another variant (0, 1, 2)."""
    return (n // 50) % 3


def defs(app: duetime.App, task: object, variant: int) -> list[duetime.ScheduleDef]:
    out = []
    for i in range(N):
        # one schedule in four changes with the variant (its payload), the others never do
        kwargs = {"v": variant} if i % 4 == 0 else {}
        out.append(app.schedule_def(f"cu-{i:03d}", EVERY, task, kwargs=kwargs,  # type: ignore[arg-type]
                                    catchup="all", max_catchup=100_000))
    return out


def main() -> None:
    url, ns, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    final = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    app = duetime.App(redis_url=url, namespace=ns)

    @app.task(name="cu.noop")
    def noop(v: int = 0) -> None: ...

    r = app.store.client
    counter, reports = f"{ns}:test:rounds", f"{ns}:test:wrote"
    done = 0
    while True:
        if final:
            if done >= final:
                break
            variant = FINAL
        else:
            n = int(r.incr(counter))
            if n > rounds:
                break
            variant = variant_for(n)
        batch = defs(app, noop, variant)
        random.shuffle(batch)  # replicas declare in different orders
        for d, status in zip(batch, app.schedules.upsert_many(batch), strict=True):
            # a version written twice would be a lost compare-and-set
            if status[0] in ("created", "updated") and not r.hsetnx(
                    f"{reports}:{d.name}", str(status[1]), d.def_hash()):
                r.incr(f"{ns}:test:dup_versions")
        done += 1
    app.close()


if __name__ == "__main__":
    main()
