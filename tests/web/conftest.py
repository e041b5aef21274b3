"""Fixtures of the web console's tests: one server kind (the console reads through code the
rest of the suite runs against both), the console as an ASGI app in-process, and
`duetime web` as a real process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from duetime.embedded import EmbeddedServer
from tests.apps import webapp
from tests.conftest import Procs

TOKEN = "test-write-token-0123456789"


@pytest.fixture
def server(servers: dict[str, EmbeddedServer]) -> EmbeddedServer:
    return servers["valkey"]


@pytest.fixture
def wapp(url: str, namespace: str):
    webapp.app.configure(redis_url=url, namespace=namespace)
    webapp.app.store.ready()
    yield webapp.app
    webapp.app.close()


@pytest.fixture
def console(wapp) -> Iterator[Callable[..., httpx.Client]]:
    """`console(token=None)`: an HTTP client (with its own cookies) of the console served by
    uvicorn in a thread of this process, for the test's namespace."""
    import uvicorn

    from duetime.web.server import create_app

    running: list[tuple[uvicorn.Server, threading.Thread, httpx.Client]] = []

    def make(token: str | None = None) -> httpx.Client:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(wapp, token), host="127.0.0.1", port=port,
                                               log_level="warning", access_log=False))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.01)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        running.append((server, thread, client))
        return client

    yield make
    for server, thread, client in running:
        client.close()
        server.should_exit = True
        thread.join(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def web(procs: Procs) -> Iterator[Callable[..., str]]:
    """`web(token=None)` starts `duetime web` on a free port and returns its base URL."""

    def start(token: str | None = None) -> str:
        port = free_port()
        args = ["web", "--port", str(port)]
        if token:
            args += ["--write-token", token]
        p = procs.duetime(*args)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/workers", timeout=2).status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if p.poll() is not None:
                raise AssertionError(f"duetime web exited: {p.stderr.read().decode() if p.stderr else ''}")
            if time.monotonic() > deadline:
                raise AssertionError("duetime web did not answer within 30 s")
            time.sleep(0.1)

    yield start
