"""Waiting for the server at a long-running process's start (worker, scheduler, reaper, web).

In Kubernetes a worker is often started before its Redis: exiting then makes a crash loop
with growing restart delays. So a long-running process waits for the server instead, unready
on `/readyz` (check `redis`) and saying so in one log line per back-off step. It exits only on
what waiting cannot cure, bad configuration: a URL that is not a Redis URL (refused before
this is reached), a password or user the server refuses, a missing ACL permission.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from duetime.common import metrics
from duetime.common.connection import redact
from duetime.common.logs import get as get_logger
from duetime.common.outage import bounded, jittered

log = get_logger("duetime.startup")

WAIT_CAP_S = 5.0  # the longest step between two tries: a server that comes up is used soon
CHECK = "redis"  # the /readyz check that says the process waits for its server
# not up yet: worth waiting for. AuthenticationError is a ConnectionError in redis-py, but no
# amount of waiting makes a wrong password right: it is told apart below
NOT_UP = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException,
          OSError)


def answers(client: Any) -> None:
    """The probe: TIME, which every documented ACL role allows (PING is not in the scheduler's
    role, docs/operations.md; the worker's has it for its wake subscription's health checks)
    and which every duetime process sends anyway."""
    client.time()


def wait_for_server(probe: Callable[[], Any], url: str, role: str,
                    sleep: Callable[[float], None] = time.sleep) -> int:
    """Call `probe` (`answers(client)`) until it answers; returns the number of failed tries. A
    refusal that is not "not up yet" (auth, ACL) is raised at once."""
    failures = 0
    while True:
        try:
            probe()
        except redis.AuthenticationError:
            raise
        except NOT_UP as exc:
            failures += 1
            wait = jittered(failures, WAIT_CAP_S)
            reason = f"waiting for Redis at {redact(url)}: {bounded(exc)}"
            metrics.health.ready(CHECK, False, reason)
            log.warning("redis not up yet; waiting", url=redact(url), role=role,
                        error=bounded(exc), tries=failures, retry_in=round(wait, 2))
            sleep(wait)
            continue
        if failures:
            log.info("redis is up", url=redact(url), role=role, tries=failures + 1)
        metrics.health.forget(CHECK)
        return failures


def unverified_tls(url: str) -> bool:
    """A TLS URL that turns certificate verification off (`?ssl_cert_reqs=none`): encrypted,
    but anyone on the path can pose as the server and read every payload."""
    parsed = urlsplit(url)
    if not parsed.scheme.startswith("rediss"):
        return False
    reqs = [v.strip().lower() for k, vs in parse_qs(parsed.query).items()
            if k.lower() == "ssl_cert_reqs" for v in vs]
    return any(v in ("none", "cert_none", "optional", "cert_optional") for v in reqs)


def warn_unverified_tls(url: str, role: str) -> None:
    if unverified_tls(url):
        log.warning("TLS without certificate verification (ssl_cert_reqs=none): the server's "
                    "identity is not checked; give it a CA (ssl_ca_certs=...) instead",
                    url=redact(url), role=role)
