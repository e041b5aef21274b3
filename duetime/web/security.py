"""Who may change what: writes need the operator's write token (entered once per browser
session) and every POST carries a CSRF token bound to that session.

Tokens are HMACs of the session id under a secret drawn when the server starts, so nothing is
stored server-side and a restart signs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from urllib.parse import urlsplit

SESSION_COOKIE = "duetime_session"
WRITE_COOKIE = "duetime_write"
CSRF_FIELD = "csrf"
MIN_TOKEN = 16


class Guard:
    def __init__(self, write_token: str | None) -> None:
        self.write_token = write_token
        self._secret = os.urandom(32)

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

    def write_cookie(self, session: str) -> str:
        return self._sign("write", session)

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
