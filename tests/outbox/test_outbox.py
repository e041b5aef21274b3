"""The transactional outbox on a private PostgreSQL (tests/outbox/conftest.py): exactly one
run per committed row, none for a rolled-back one (psycopg 3 and SQLAlchemy 2), two relays
never double a row, a relay SIGKILLed between its enqueue and its commit loses and doubles
nothing, and `once` makes a retried attempt skip an effect its killed predecessor committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import psycopg
import pytest

from duetime import outbox
from duetime.client.runs import keyed_run_id
from tests.apps import outbox_app
from tests.conftest import ROOT, wait_for


@pytest.fixture
def oapp(url: str, namespace: str):
    outbox_app.app.configure(redis_url=url, namespace=namespace)
    yield outbox_app.app
    outbox_app.app.close()


def _rows(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        return int(c.execute(f"SELECT count(*) FROM {outbox.TABLE}").fetchone()[0])


def _runs_by_key(app, keys):
    """Each key's run id (a keyed run's id is a function of its task and key)."""
    return [keyed_run_id("outbox.count", k) for k in keys]


def _run_count(r, namespace: str) -> int:
    """How many run records the namespace holds (`T:run:<id>` of every partition)."""
    return sum(1 for k in r.scan_iter(f"{namespace}:*", count=1000) if b":run:" in k)


def test_committed_rows_become_one_run_each_rolled_back_ones_none_psycopg(db, oapp, r, namespace):
    with psycopg.connect(db) as conn:
        with conn.transaction():
            committed = [outbox.enqueue(conn, outbox_app.count, [i]) for i in range(5)]
        with pytest.raises(ZeroDivisionError), conn.transaction():
            outbox.enqueue(conn, outbox_app.count, [99])
            raise ZeroDivisionError("rolled back")
        conn.commit()
    assert _rows(db) == 5
    with psycopg.connect(db) as conn:
        assert outbox.relay_once(conn, oapp, batch=100) == 5
        assert outbox.relay_once(conn, oapp, batch=100) == 0
    assert _rows(db) == 0
    ids = _runs_by_key(oapp, [outbox.run_key(i) for i in committed])
    assert len(set(ids)) == 5
    infos = [oapp.get_run(i) for i in ids]
    assert sorted(info.args[0] for info in infos) == [0, 1, 2, 3, 4]
    # the rolled-back row's argument is on no run: only the five keys' runs exist
    assert _run_count(r, namespace) == 5


def test_sqlalchemy_connection_and_session(db, oapp, r, namespace):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(db.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            a = outbox.enqueue(conn, "outbox.count", [1], {"note": "core"}, queue="default")
        with pytest.raises(RuntimeError), engine.begin() as conn:
            outbox.enqueue(conn, "outbox.count", [2])
            raise RuntimeError("rolled back")
        with Session(engine) as session:
            b = outbox.enqueue(session, outbox_app.count, [3], delay="1s")
            session.commit()
        with Session(engine) as session:
            outbox.enqueue(session, outbox_app.count, [4])
            session.rollback()
    finally:
        engine.dispose()
    assert _rows(db) == 2
    with psycopg.connect(db) as conn:
        assert outbox.relay_once(conn, oapp) == 2
    ids = _runs_by_key(oapp, [outbox.run_key(a), outbox.run_key(b)])
    assert sorted(oapp.get_run(i).args[0] for i in ids) == [1, 3]
    assert oapp.get_run(ids[0]).kwargs == {"note": "core"}
    assert _run_count(r, namespace) == 2


def test_bad_arguments_are_refused_before_anything_is_written(db):
    from duetime import InvalidInput

    with psycopg.connect(db) as conn:
        with pytest.raises(InvalidInput):
            outbox.enqueue(conn, outbox_app.count, [1, 2, 3])  # too many for count(i, note)
        with pytest.raises(InvalidInput):
            outbox.enqueue(conn, "outbox.count", [object()])
        conn.commit()
    assert _rows(db) == 0


def test_two_relays_at_once_never_double_a_row(db, oapp, r, namespace):
    n = 400
    with psycopg.connect(db) as conn, conn.transaction():
        keys = [outbox.run_key(outbox.enqueue(conn, outbox_app.count, [i])) for i in range(n)]
    moved: list[int] = []
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            moved.append(outbox.relay(db, oapp, batch=7, once_only=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(moved) == n and _rows(db) == 0
    assert _run_count(r, namespace) == n
    assert len(set(_runs_by_key(oapp, keys))) == n


_KILLED_RELAY = """
import os, signal, sys
import psycopg
import duetime
from duetime import outbox
from duetime.client.runs import keyed_run_id
app = duetime.App(redis_url=sys.argv[2], namespace=sys.argv[3])
def die(run_ids):
    print(len(run_ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # enqueued in Redis, the delete not committed
with psycopg.connect(sys.argv[1]) as conn:
    outbox.relay_once(conn, app, batch=50, after_enqueue=die)
"""


def test_a_relay_sigkilled_between_enqueue_and_commit_loses_and_doubles_nothing(
        db, oapp, r, namespace, url):
    n = 120
    with psycopg.connect(db) as conn, conn.transaction():
        keys = [outbox.run_key(outbox.enqueue(conn, outbox_app.count, [i])) for i in range(n)]
    p = subprocess.run([sys.executable, "-c", _KILLED_RELAY, db, url, namespace], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "50"
    assert _run_count(r, namespace) == 50  # those runs exist ...
    wait_for(lambda: _rows(db) == n, what="the killed relay's locks to go")  # ... their rows too
    # a new relay (the CLI command) moves everything: the 50 again under the same keys
    cli = subprocess.run([sys.executable, "-m", "duetime", "--redis-url", url, "--namespace", namespace,
                          "outbox", "relay", "--dsn", db, "--batch", "30", "--once"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "relayed 120 rows" in cli.stdout
    assert _rows(db) == 0
    assert _run_count(r, namespace) == n  # 120 runs, not 170
    ids = _runs_by_key(oapp, keys)
    assert len(set(ids)) == n
    assert sorted(oapp.get_run(i).args[0] for i in ids) == list(range(n))


def test_once_skips_the_effect_an_attempt_committed_before_its_worker_was_killed(
        db, oapp, procs, r, monkeypatch):
    monkeypatch.setenv("DUETIME_TEST_PG_DSN", db)
    with psycopg.connect(db) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, cents bigint NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (1, 0)")
        conn.commit()
    attempts = outbox_app.key("attempts")
    first = procs.worker("--lease", "1s", app="tests.apps.outbox_app:app")
    procs.reaper()
    run_id = outbox_app.credit.enqueue(1, 500)
    try:
        wait_for(lambda: r.lrange(attempts, 0, -1) == [b"1:applied"], timeout=60,
                 what="the first attempt's commit")
    except AssertionError:
        first.kill()
        raise AssertionError(first.communicate()[1].decode()[-3000:]) from None
    first.send_signal(signal.SIGKILL)
    first.wait()
    procs.worker("--lease", "1s", app="tests.apps.outbox_app:app")
    assert oapp.wait(run_id, timeout=60) is None
    assert r.lrange(attempts, 0, -1) == [b"1:applied", b"2:skipped"]
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT cents FROM accounts WHERE id = 1").fetchone()[0] == 500
        assert conn.execute(f"SELECT count(*) FROM {outbox.EFFECTS}").fetchone()[0] == 1


def test_once_answers_by_the_committed_record(db):
    with psycopg.connect(db) as conn:
        with conn.transaction():
            assert outbox.once(conn, "e1") is True
        with conn.transaction():
            assert outbox.once(conn, "e1") is False
        with pytest.raises(RuntimeError), conn.transaction():
            assert outbox.once(conn, "e2") is True
            raise RuntimeError
        with conn.transaction():
            assert outbox.once(conn, "e2") is True  # the rolled-back record does not count


def test_a_batch_whose_enqueue_fails_rolls_back_and_its_rows_wait(db, namespace):
    import socket

    import duetime

    with socket.socket() as s:  # a port nothing listens on: Redis is down
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    down = duetime.App(redis_url=dead, namespace=namespace)
    with psycopg.connect(db) as conn, conn.transaction():
        for i in range(3):
            outbox.enqueue(conn, "outbox.count", [i])
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a refused connection
        outbox.relay(db, down, once_only=True)
    down.close()
    assert _rows(db) == 3


def test_the_relay_command_says_in_one_line_that_the_database_is_unreachable(url, namespace):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-m", "duetime", "--redis-url", url, "--namespace", namespace,
                        "outbox", "relay", "--dsn", f"postgresql://postgres@127.0.0.1:{port}/x", "--once"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: postgresql: connection failed")
