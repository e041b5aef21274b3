"""A private PostgreSQL server for the outbox and Django tests: never the machine's own.

`initdb` into a temporary directory, `postgres` on a free loopback port (its unix socket in
that directory, `-c listen_addresses=127.0.0.1`), trust authentication, user `postgres`;
stopped at the end of the session. The binaries come from PATH, else from
/usr/lib/postgresql/*/bin (Debian's `postgresql` package). Without them the tests are skipped
and say so.

initdb and postgres refuse to run as root. Run as root (this project's machines and CI), the
fixture runs them as the unprivileged `nobody` through `runuser -u nobody --` (util-linux,
present on Debian) with the temporary directory chown'ed to it; as another user, directly.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

psycopg = pytest.importorskip("psycopg", reason="the outbox tests need psycopg 3 (the outbox extra)")


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for path in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin: "
                    "apt-get install postgresql to run the outbox and Django tests")
    tmp = tempfile.mkdtemp(prefix="duetime-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(tmp, user="nobody")
        os.chmod(tmp, 0o700)
        as_user = ["runuser", "-u", "nobody", "--"]
    data, log = os.path.join(tmp, "data"), os.path.join(tmp, "log")
    port = _free_port()
    subprocess.run([*as_user, initdb, "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    opts = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
    subprocess.run([*as_user, pg_ctl, "-D", data, "-l", log, "-w", "-t", "60", "-o", opts, "start"],
                   check=True, stdout=subprocess.DEVNULL)
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(dsn, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield dsn
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def db(pg_dsn: str) -> Iterator[str]:
    """A fresh database of the private server for one test: its DSN."""
    name = f"t{os.urandom(5).hex()}"
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    dsn = pg_dsn.rsplit("/", 1)[0] + f"/{name}"
    from duetime import outbox

    with psycopg.connect(dsn) as c:
        outbox.create_table(c)
    yield dsn
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE {name} WITH (FORCE)")
