"""A TLS-only redis-server for tests, with certificates made by the `openssl` command: a CA,
a server certificate for 127.0.0.1 and a client certificate the server requires."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import redis

from duetime.embedded import answering, free_port, redis_server_binary

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-new", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-subj", f"/CN=duetime test {name}", cwd=d)


def _signed(d: Path, name: str, cn: str, ext: str, ca: str = "ca") -> None:
    _openssl("req", "-new", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={cn}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


@dataclass
class Certs:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)


def make_certs(d: Path) -> Certs:
    """ca.{crt,key}, server.{crt,key} (127.0.0.1, localhost), client.{crt,key}, and another CA
    (other-ca) that signed none of them."""
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n")
    _signed(d, "client", "duetime-worker", "extendedKeyUsage=clientAuth\n")
    return Certs(d)


class TlsServer:
    """redis-server listening on a TLS port only (`--port 0`), requiring client certificates."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="duetime-tls-"))
        self.certs = make_certs(self.dir)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, ca: str = "ca.crt", client_cert: bool = True, **extra: str) -> str:
        q = {"ssl_ca_certs": self.certs.path(ca)}
        if client_cert:
            q |= {"ssl_certfile": self.certs.path("client.crt"),
                  "ssl_keyfile": self.certs.path("client.key")}
        return f"rediss://127.0.0.1:{self.port}/0?{urlencode(q | extra)}"

    def start(self) -> TlsServer:
        c = self.certs
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--save", "", "--appendonly", "no",
             "--maxmemory-policy", "noeviction", "--tls-cert-file", c.path("server.crt"),
             "--tls-key-file", c.path("server.key"), "--tls-ca-cert-file", c.path("ca.crt"),
             "--tls-auth-clients", "yes"], stdout=log, stderr=subprocess.STDOUT)
        answering(redis.Redis.from_url(self.url(), socket_connect_timeout=0.5), self.proc, 15,
                  f"TLS redis-server did not start: {self.dir}/server.log", every_s=0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
