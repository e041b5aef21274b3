"""Fixtures: real Redis and Valkey servers on free loopback ports, one namespace per test,
and worker/reaper processes started the way an operator starts them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from duetime.common.connection import sync_client

from duetime.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
SERVER_KINDS = ("redis", "valkey")


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, EmbeddedServer]]:
    started: dict[str, EmbeddedServer] = {}
    try:
        for kind in SERVER_KINDS:
            started[kind] = EmbeddedServer(kind).start()
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(params=SERVER_KINDS)
def server(request: pytest.FixtureRequest, servers: dict[str, EmbeddedServer]) -> EmbeddedServer:
    return servers[request.param]


@pytest.fixture
def url(server: EmbeddedServer) -> str:
    return server.url


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def r(url: str) -> Iterator[redis.Redis]:
    client = sync_client(url)  # loads duetime's scripts on connect, like every duetime client
    yield client
    client.close()


@pytest.fixture
def app(url: str, namespace: str):
    from tests.apps import basic

    basic.app.configure(redis_url=url, namespace=namespace)
    yield basic.app
    basic.app.close()


class Procs:
    """Processes started by a test; all are killed at the end of it."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url, self.namespace = url, namespace
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        return {**os.environ, "DUETIME_REDIS_URL": self.url, "DUETIME_NAMESPACE": self.namespace,
                "PYTHONPATH": str(ROOT)}

    def duetime(self, *args: str, log: str = "WARNING") -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", log, *args],
                             env=self.env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(p)
        return p

    def worker(self, *args: str, app: str = "tests.apps.basic:app") -> subprocess.Popen[bytes]:
        return self.duetime("worker", "--app", app, *args)

    def reaper(self, tick: str = "100ms") -> subprocess.Popen[bytes]:
        return self.duetime("reaper", "--tick", tick)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def procs(url: str, namespace: str) -> Iterator[Procs]:
    ps = Procs(url, namespace)
    yield ps
    ps.stop_all()


def wait_for(pred: Callable[[], object], timeout: float = 20.0, interval: float = 0.05,
             what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
