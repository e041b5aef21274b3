"""The console's HTTP edges: a Host allow-list against DNS rebinding, and security headers."""

from __future__ import annotations

from duetime.web.edges import HostAllowList
from duetime.web.security import same_origin


def test_a_rebound_host_name_is_refused_and_every_response_carries_the_headers(console):
    client = console()
    ok = client.get("/")
    assert ok.status_code == 200
    for r in (ok, client.get("/runs"), client.get("/static/nope.css")):
        assert r.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin"  # no-referrer: Origin null
    rebound = client.get("/", headers={"Host": "attacker.example"})
    assert rebound.status_code == 400 and "Host" in rebound.text
    assert client.get("/runs", headers={"Host": f"attacker.example:{client.base_url.port}"}
                      ).status_code == 400
    assert client.get("/", headers={"Host": f"localhost:{client.base_url.port}"}).status_code == 200


def test_the_allow_list_takes_configured_names_and_the_bound_port():
    hosts = HostAllowList(["console.example.com"], port=8080)
    assert hosts.allows("console.example.com") and hosts.allows("Console.Example.com:8080")
    assert hosts.allows("127.0.0.1:8080") and hosts.allows("[::1]:8080")
    assert not hosts.allows("console.example.com:9999")  # not the bound port
    assert not hosts.allows("attacker.example") and not hosts.allows("") and not hosts.allows(None)
    assert not hosts.allows("console.example.com:x")


def test_same_origin_does_not_trust_the_host_header():
    """With DNS rebinding, Origin and Host both name the attacker's domain: equal, refused."""
    hosts = HostAllowList(port=8080)
    assert not same_origin("http://evil.example", "evil.example", hosts.allows)
    assert same_origin("http://127.0.0.1:8080", "127.0.0.1:8080", hosts.allows)
    assert not same_origin("http://127.0.0.1:8080", "127.0.0.1:9090", hosts.allows)
