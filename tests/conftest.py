"""Fixtures: real Redis and Valkey servers on free loopback ports, one namespace per test,
and worker/reaper processes started the way an operator starts them.

Which server a test runs on depends on what it proves (docs/testing.md):

- A test marked `scripts` (`pytestmark = pytest.mark.scripts` in its module, or the mark on
  the test) proves a Lua script's behaviour: the `server` fixture (and `url`, `r`, `app`
  built on it) runs it on Redis, on Valkey and on `memory`, the in-memory backend of
  `duetime.testing` (fakeredis running the same Lua, in this process). A test that needs a
  real server process (a worker subprocess, a restart, CONFIG, ACLs) says why with
  `@pytest.mark.scripts(memory="<reason>")`: its `memory` case is skipped with that reason.
  Tests using `procs` skip it on their own (a subprocess cannot reach this process's memory).
- Every other test proves Python logic and runs once, on Valkey: the server `make demo`
  starts, so the one kind a newcomer runs is the one the suite runs most.

`pytest -m scripts` runs every test that covers `lua/` (minutes: clusters, failovers and worker
processes among them); `make test-scripts`, i.e. `pytest -m "scripts and not slow"`, is the
fast lane (under a minute): the tests that drive the scripts directly or through an
in-process worker. A test using a fixture that starts processes (PROCESS_FIXTURES) is marked
`slow` here.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from duetime.common.connection import sync_client

from duetime.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
SERVER_KINDS = ("redis", "valkey")  # the real servers, both started once per session
SCRIPT_KINDS = (*SERVER_KINDS, "memory")  # what a `scripts` test runs on
DEFAULT_KIND = "valkey"  # what every other test runs on
NO_MEMORY_WITH_PROCS = "a worker subprocess cannot reach this process's in-memory backend"


class MemoryServer:
    """The `memory` server kind: the in-memory backend of duetime.testing, named by its URL
    (one per test, forgotten after it)."""

    kind = "memory"

    def __init__(self) -> None:
        self.url = f"memory://t{uuid.uuid4().hex[:10]}"

    def stop(self) -> None:
        from duetime.common import memory

        memory.reset(self.url)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`scripts` tests get one case per server kind; the others none (they run on
    DEFAULT_KIND)."""
    mark = metafunc.definition.get_closest_marker("scripts")
    if mark is None or "server" not in metafunc.fixturenames:
        return
    reason = mark.kwargs.get("memory")
    if reason is None and "procs" in metafunc.fixturenames:
        reason = NO_MEMORY_WITH_PROCS
    kinds = [pytest.param(k, marks=pytest.mark.skip(reason=f"memory: {reason}"))
             if k == "memory" and reason else k for k in SCRIPT_KINDS]
    metafunc.parametrize("server", kinds, indirect=True)


PROCESS_FIXTURES = frozenset({"procs", "cprocs", "rcluster", "cluster"})
# `make soak` (DUETIME_SOAK=1): the tests at the sizes their issues named, and the latency bounds
# a loaded machine cannot promise; CI runs the same checks at sizes it finishes in seconds
# (docs/testing.md, "Time in tests")
SOAK = os.environ.get("DUETIME_SOAK") == "1"


def pytest_configure(config: pytest.Config) -> None:
    from tests import timing

    config.pluginmanager.register(timing, "duetime-timing")  # the files' order (tests/timing.py)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts worker, scheduler or cluster processes takes seconds: it is `slow`
    (out of the fast lane `-m "scripts and not slow"`, still in `make test`)."""
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture
def server(request: pytest.FixtureRequest,
           servers: dict[str, EmbeddedServer]) -> Iterator[EmbeddedServer | MemoryServer]:
    """The server of this test: its case's kind for a `scripts` test, else DEFAULT_KIND."""
    kind = getattr(request, "param", DEFAULT_KIND)
    if kind != "memory":
        yield servers[kind]
        return
    memory = MemoryServer()
    yield memory
    memory.stop()


@pytest.fixture
def url(server: EmbeddedServer | MemoryServer) -> str:
    return server.url


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def r(url: str) -> Iterator[redis.Redis]:
    client = sync_client(url)  # loads duetime's scripts on connect, like every duetime client
    yield client
    client.close()


@contextlib.contextmanager
def configured(app: Any, url: str, prefix: str) -> Iterator[Any]:
    """`app` on `url` in a namespace of its own (`prefix` + a random tag), closed afterwards:
    the body of an `app` fixture for another server (a cluster)."""
    app.configure(redis_url=url, namespace=f"{prefix}{uuid.uuid4().hex[:8]}")
    try:
        yield app
    finally:
        app.close()


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


# No wait gives up sooner than this, whatever its caller asked for. A wait returns as soon as
# its condition holds, so a long deadline costs a passing test nothing; a short one turns a
# loaded machine into a failure that says nothing about the code (a clean-clone CI run beside
# other work missed a 15 s "run to start" and a 20 s "ticks after the move" on a cluster).
# A deadline is never a latency bound: those belong in bench/.
WAIT_FLOOR_S = 60.0


def wait_for(pred: Callable[[], object], timeout: float = 20.0, interval: float = 0.05,
             what: str = "condition") -> object:
    """Poll ``pred`` until it returns something truthy (and return that), or fail after
    ``timeout`` seconds, never fewer than WAIT_FLOOR_S."""
    timeout = max(timeout, WAIT_FLOOR_S)
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
