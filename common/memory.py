"""An in-memory Redis, for unit tests of users' own tasks (`duetime.testing`): URLs of the form
`memory://<name>` give fakeredis clients that share one in-process server per name, with
duetime's scripts loaded, so enqueue, claim, retries and every state go through the same
Lua as on a real server. (duetime's own tests prove the scripts on real Redis and Valkey;
this backend is for users' unit tests, which should need no server.)
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from duetime.common import scripts
from duetime.common.errors import InvalidInput

SCHEME = "memory"
_servers: dict[str, Any] = {}
_lock = threading.Lock()


def is_memory(url: str) -> bool:
    return urlsplit(url).scheme == SCHEME


def _server(url: str) -> Any:
    try:
        import fakeredis
        import lupa  # noqa: F401 - fakeredis runs Lua with it
    except ImportError:
        raise InvalidInput("the in-memory backend (duetime.testing) needs fakeredis with Lua: "
                           "pip install 'duetime[testing]'") from None
    name = urlsplit(url).netloc or "default"
    with _lock:
        server = _servers.get(name)
        if server is None:
            server = _servers[name] = fakeredis.FakeServer()
            loader = fakeredis.FakeRedis(server=server)
            for script in scripts.SCRIPT_NAMES:
                loader.script_load(scripts.plain(script).source)
            loader.close()
        return server


def sync_client(url: str) -> Any:
    import fakeredis

    client: Any = fakeredis.FakeRedis(server=_server(url))  # it carries the marker below
    client.duetime_plain_scripts = True  # fakeredis reads no `#!lua` line
    return client


def async_client(url: str) -> Any:
    import fakeredis

    client: Any = fakeredis.FakeAsyncRedis(server=_server(url))
    client.duetime_plain_scripts = True
    return client


def reset(url: str) -> None:
    """Forget the in-memory server of `url` (its data and scripts)."""
    with _lock:
        _servers.pop(urlsplit(url).netloc or "default", None)
