"""The worker's estimate of the Redis server clock (the only clock that decides due times)."""

from __future__ import annotations

import time

import redis.asyncio as aredis


class ServerClock:
    def __init__(self) -> None:
        self.offset_ms = 0.0  # server - local
        self.error_ms = 0.0  # bound on the estimate's error: half the round trip it came from

    async def sync(self, client: aredis.Redis, samples: int = 3) -> None:
        """Keep the sample with the shortest round trip: its midpoint is the best estimate."""
        best: tuple[float, float] | None = None
        for _ in range(samples):
            t0 = time.time()
            sec, usec = await client.time()
            t1 = time.time()
            rtt = t1 - t0
            offset = (sec * 1000 + usec / 1000) - (t0 + t1) * 500
            if best is None or rtt < best[0]:
                best = (rtt, offset)
        assert best is not None
        self.offset_ms = best[1]
        self.error_ms = best[0] * 500

    def now_ms(self) -> float:
        return time.time() * 1000 + self.offset_ms
