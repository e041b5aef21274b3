"""The console mounted under a path of another ASGI application (a FastAPI or Starlette host
app: `host.mount("/ops", create_app(app))`, docs/integrations.md).

The console's pages link with absolute paths (`/runs/...`, forms posting to `/dead/replay`,
redirects to `/schedules/...`). Mounted, the host's router gives the console a `root_path`
(`/ops`); this ASGI middleware, which `create_app` always puts in front, then makes the
console's own absolute links, form actions, asset paths, redirects and cookie paths point
under it. Served on its own (`duetime web`), the root path is empty and responses pass
through untouched.
"""

from __future__ import annotations

import re
from typing import Any

_ATTRS = re.compile(rb'\b(href|action|src)="/(?!/)')
_COOKIE_PATH = re.compile(rb"(?i)(;\s*path=)/(?=;|$)")


class UnderPrefix:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        root = scope.get("root_path", "") if scope["type"] == "http" else ""
        if not root or root == "/":
            await self.app(scope, receive, send)
            return
        prefix = root.rstrip("/").encode("latin-1")
        start: dict[str, Any] = {}
        parts: list[bytes] = []

        def header(k: bytes, v: bytes) -> bytes:
            if k == b"location" and v.startswith(b"/") and not v.startswith(b"//") \
                    and not v.startswith(prefix + b"/"):
                return prefix + v
            if k == b"set-cookie":
                return _COOKIE_PATH.sub(rb"\g<1>" + prefix, v)
            return v

        async def rewriting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, header(k.lower(), v)) for k, v in message.get("headers", [])]
                message = {**message, "headers": headers}
                if any(k.lower() == b"content-type" and v.startswith(b"text/html")
                       for k, v in headers):
                    start.update(message)  # the body is rewritten: sent once it is whole
                    return
                await send(message)
                return
            if message["type"] == "http.response.body" and start:
                parts.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = _ATTRS.sub(rb'\1="' + prefix + b"/", b"".join(parts))
                headers = [(k, str(len(body)).encode() if k.lower() == b"content-length" else v)
                           for k, v in start["headers"]]
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, rewriting)
