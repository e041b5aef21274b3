"""The console's HTTP edges: which Host it answers, and the headers every response carries.

DNS rebinding: a page on `attacker.example` re-points its name at 127.0.0.1 and reads the
console as its own origin (the browser sends `Host: attacker.example`). So the console answers
only the names it was bound to or told about (`duetime web --allowed-host NAME`), by default
the loopback names, and refuses any other Host with 400. A port, when the Host names one,
must be the bound port (when known).

Headers: no framing (`X-Frame-Options: DENY`, CSP `frame-ancestors 'none'`: clickjacking of
the action buttons), no MIME sniffing, no Referer to other sites (run ids and arguments are
in URLs). `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null`
on the console's own form POSTs, which `same_origin()` must refuse (a sandboxed frame sends it
too), so no action could be taken from a browser at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the
    # console's own form posts, which same_origin() must refuse (tests/web/test_browser.py)
    (b"referrer-policy", b"same-origin"),
]


def split_host(value: str) -> tuple[str, int | None]:
    """'name:port' or '[v6]:port' -> (lower-case name, port or None); ('', None) if unreadable."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        name, rest = value[1:end], value[end + 1:]
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    else:
        name, sep, port_text = value.partition(":")
        if not sep:
            port_text = ""
    if port_text == "":
        return name.rstrip("."), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return "", None
    return name.rstrip("."), int(port_text)


class HostAllowList:
    """The Host names (and port) the console answers to."""

    def __init__(self, names: Iterable[str] = (), port: int | None = None) -> None:
        self.names = frozenset(split_host(n)[0] or n.lower() for n in names) | LOOPBACK
        self.port = port

    def allows(self, host: str | None) -> bool:
        if not host:
            return False
        name, port = split_host(host)
        return bool(name) and name in self.names and (
            port is None or self.port is None or port == self.port)


class Edges:
    """ASGI middleware: refuses a Host not allowed (400), adds the security headers."""

    def __init__(self, app: Any, hosts: HostAllowList) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"),
                    None)
        if not self.hosts.allows(host):
            body = b"400 Bad Request: this console does not answer to that Host name\n"
            await send({"type": "http.response.start", "status": 400, "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()), *HEADERS]})
            await send({"type": "http.response.body", "body": body})
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
