"""Who may change what: writes need the operator's write token (entered once per browser
session) and every POST carries a CSRF token bound to that session.

Tokens are HMACs of the session id under a secret drawn when the server starts, so a restart
signs everyone out. Two things are kept server-side, both bounded:

- **Revocation.** A write cookie's MAC also covers the session's lock generation: `/lock`
  bumps it, so a copy of the cookie saved before the lock (another tab, a stolen cookie) stops
  working, and unlocking again issues a cookie of the new generation. Past `MAX_TRACKED`
  sessions with a generation, the epoch mixed into every MAC is redrawn instead: every write
  cookie is revoked at once (the safe way to forget).
- **Throttling.** Wrong write tokens are counted per client address: after `FREE_TRIES`
  failures the address is locked out of checking for `LOCKOUT_S`, doubling with each further
  failure up to `MAX_LOCKOUT_S`; while locked out no token is even compared (a right one is
  refused too, with the time left), and a right token afterwards clears the count. Behind a
  reverse proxy every browser shares the proxy's address: a guessing attacker then locks the
  operators out too, which is the price of not trusting a client-supplied address header.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

SESSION_COOKIE = "duetime_session"
WRITE_COOKIE = "duetime_write"
CSRF_FIELD = "csrf"
MIN_TOKEN = 16
FREE_TRIES = 5  # wrong tokens an address may send before the first lockout
LOCKOUT_S = 1.0  # the first lockout; doubles with each wrong token after it
MAX_LOCKOUT_S = 300.0
MAX_TRACKED = 10_000  # addresses (throttle) and sessions (lock generations) remembered


class Throttle:
    """Failed token checks per client address, and the lockout they earn (see the module
    docstring). `clock` is injectable so tests move time instead of sleeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # addr -> (n, until)

    def wait_s(self, addr: str) -> float:
        """Seconds until `addr` may have a token checked again (0: now)."""
        entry = self._failures.get(addr)
        return max(0.0, entry[1] - self.clock()) if entry else 0.0

    def failed(self, addr: str) -> float:
        """Count one wrong token; → the lockout it starts (0: none yet)."""
        n = self._failures.pop(addr, (0, 0.0))[0] + 1
        lockout = 0.0 if n < FREE_TRIES else min(LOCKOUT_S * 2 ** (n - FREE_TRIES), MAX_LOCKOUT_S)
        self._failures[addr] = (n, self.clock() + lockout)
        while len(self._failures) > MAX_TRACKED:
            self._failures.popitem(last=False)  # the address least recently failing
        return lockout

    def succeeded(self, addr: str) -> None:
        self._failures.pop(addr, None)


class Guard:
    def __init__(self, write_token: str | None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.write_token = write_token
        self._secret = os.urandom(32)
        self._epoch = os.urandom(16)
        self._generation: OrderedDict[str, int] = OrderedDict()  # session -> locks so far
        self.throttle = Throttle(clock)

    @property
    def read_only(self) -> bool:
        return not self.write_token

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def _sign(self, purpose: str, session: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{session}".encode(), hashlib.sha256).hexdigest()

    def csrf_token(self, session: str) -> str:
        return self._sign("csrf", session)

    def csrf_ok(self, session: str | None, sent: str | None) -> bool:
        return bool(session and sent) and hmac.compare_digest(self.csrf_token(session or ""), sent or "")

    def token_ok(self, sent: str) -> bool:
        return bool(self.write_token) and hmac.compare_digest(
            (self.write_token or "").encode(), sent.encode())

    def check_token(self, addr: str, sent: str) -> tuple[bool, float]:
        """The throttled token check of `/unlock` → (right token?, seconds the address must
        wait before its next try; > 0 only when refused)."""
        wait = self.throttle.wait_s(addr)
        if wait > 0:
            return False, wait  # locked out: not compared at all
        if self.token_ok(sent):
            self.throttle.succeeded(addr)
            return True, 0.0
        return False, self.throttle.failed(addr)

    def write_cookie(self, session: str) -> str:
        gen = self._generation.get(session, 0)
        return self._sign(f"write:{self._epoch.hex()}:{gen}", session)

    def lock(self, session: str) -> None:
        """Revoke every write cookie issued so far to `session` (see the module docstring)."""
        self._generation[session] = self._generation.pop(session, 0) + 1
        if len(self._generation) > MAX_TRACKED:
            self._epoch = os.urandom(16)  # revokes all write cookies; generations start over
            self._generation.clear()

    def unlocked(self, session: str | None, cookie: str | None) -> bool:
        if self.read_only or not session or not cookie:
            return False
        return hmac.compare_digest(self.write_cookie(session), cookie)


def same_origin(origin: str | None, host: str | None,
                allowed: Callable[[str], bool] | None = None) -> bool:
    """A browser's POST names its page's origin; one from another site is refused even before
    the CSRF token is checked. No Origin header (curl, old browsers): the token decides. The
    Host header is the requester's to choose (DNS rebinding), so the origin must also be one
    of the console's allowed hosts (`allowed`), not merely equal to the Host."""
    if not origin:
        return True
    if origin == "null" or not host:
        return False
    netloc = urlsplit(origin).netloc
    return netloc == host and (allowed is None or allowed(netloc))
