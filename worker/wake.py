"""The wake listener: pub/sub notices that a run became a set's earliest, fed to DueTimes.

It reconnects forever (with back-off while Redis is away) and reads the heads after each
(re)subscription, so a notice sent while unsubscribed is made up for. A message it cannot
read is counted and skipped: anyone may PUBLISH on the channel.

A subscription has nothing to say while nobody publishes, so silence alone proves nothing:
after PING_EVERY_S of it the listener PINGs, and a connection that answers neither a notice
nor the PING within REPLY_TIMEOUT_S more is taken for half-open (its peer vanished without a
FIN or an RST) and replaced -- within PING_EVERY_S + REPLY_TIMEOUT_S (7 s) of the last word.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis
import redis.asyncio as aredis
from duetime.common.connection import REPLY_TIMEOUT_S, client_glitch
from duetime.common.logs import get as get_logger
from duetime.common.loops import cancelled, pause
from duetime.common.outage import Outage, bounded
from duetime.common.wake import parse_worker_wake
from duetime.worker.due import DueTimes
from duetime.worker.errors import ANY_REDIS_ERROR

log = get_logger("duetime.worker")

WARN_EVERY_S = 60.0  # unreadable notices: one warning, then at most one a minute
PING_EVERY_S = 2.0  # of silence on the subscription before it is asked for a PONG


class WakeListener:
    def __init__(self, client: aredis.Redis, channel: str, due: DueTimes, worker_id: str) -> None:
        self.client, self.channel, self.due, self.worker_id = client, channel, due, worker_id
        self.subscribed = asyncio.Event()  # set once notices can reach us
        self.ignored = 0  # unreadable notices since the start
        self._warned_at: float | None = None
        self._ignored_unwarned = 0
        self._queues = set(due.queues)
        self._partitions = due.keys.partitions

    async def run(self, closing: asyncio.Event) -> None:
        """Listen until `closing` (common/loops.py): a read waits 1 s at most, and after each
        the listener looks at `closing`, and raises for a cancellation that the read (or a
        PING before it) swallowed."""
        outage = Outage("wake listener", log, worker_id=self.worker_id)
        while not closing.is_set():
            pubsub = self.client.pubsub()
            delay = 0.0
            try:
                await pubsub.subscribe(self.channel)
                heard = pinged = time.monotonic()
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if closing.is_set():
                        break
                    cancelled()
                    now = time.monotonic()
                    if msg is None:
                        if now - heard >= PING_EVERY_S + REPLY_TIMEOUT_S:
                            raise redis.ConnectionError(
                                f"no word on the wake subscription for {now - heard:.0f}s, a "
                                "PING unanswered: the connection is taken for half-open")
                        if now - heard >= PING_EVERY_S and now - pinged >= PING_EVERY_S:
                            await pubsub.ping()
                            pinged = now
                        continue
                    heard = now
                    if msg["type"] == "subscribe":
                        await self.due.refresh(self.client)
                        self.subscribed.set()
                        outage.ok()
                    elif msg["type"] == "message":
                        self.on_message(msg["data"])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in redis-py
                raise
            except ANY_REDIS_ERROR as exc:
                delay = outage.failed(exc)
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the wake-ups for good
                if client_glitch(exc):  # redis-py's own race on a closed connection
                    delay = outage.failed(exc)
                else:
                    log.error("wake listener failed; restarting it", error=bounded(exc),
                              worker_id=self.worker_id, exc_info=True)
                    delay = 1.0
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in redis-py
            await pause(closing, delay)

    def on_message(self, data: object) -> None:
        parsed = parse_worker_wake(data, self._partitions)
        if parsed is None:
            self._unreadable(data)
            return
        p, q, due = parsed
        if q in self._queues:
            self.due.note((p, q), due)

    def _unreadable(self, data: object) -> None:
        self.ignored += 1
        self._ignored_unwarned += 1
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            # its length only: a stray message is someone else's data
            size = len(data) if isinstance(data, bytes | str) else None
            log.warning("unreadable wake notices ignored", channel=self.channel,
                        count=self._ignored_unwarned, size=size, worker_id=self.worker_id)
            self._ignored_unwarned = 0
        else:
            log.debug("unreadable wake notice ignored", channel=self.channel, worker_id=self.worker_id)
