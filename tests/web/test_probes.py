"""The console's probes for a platform's health checks: /healthz (the process serves) and
/readyz (Redis answers the console's credential), with the Host a kubelet's probe sends."""

from __future__ import annotations

from starlette.testclient import TestClient

import duetime
from duetime.web.server import create_app


def test_healthz_and_readyz_answer_a_probe_with_host_localhost(console):
    c = console()
    for path, body in (("/healthz", "ok\n"), ("/readyz", "ready\n")):
        r = c.get(path, headers={"Host": "localhost"})
        assert (r.status_code, r.text) == (200, body), path
        assert r.headers["cache-control"] == "no-store"
        assert r.headers["x-frame-options"] == "DENY"  # the edges apply to probes too
    # an unknown Host is refused on probes as on every page (DNS rebinding)
    assert c.get("/readyz", headers={"Host": "attacker.example"}).status_code == 400


def test_readyz_is_503_while_redis_does_not_answer_and_healthz_stays_ok():
    app = duetime.App(redis_url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    with TestClient(create_app(app), base_url="http://localhost") as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.text.startswith("not ready: Redis: ")
        assert c.get("/healthz").status_code == 200
