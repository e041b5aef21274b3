"""The security tests' shared fixture: the documented ACL roles installed on the test server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from duetime.embedded import EmbeddedServer
from tests.apps import chaos as chaos_app
from tests.security.roles import Role, install, remove, roles


@pytest.fixture
def acl(server: EmbeddedServer, namespace: str) -> Iterator[tuple[EmbeddedServer, dict[str, Role]]]:
    """The documented roles as users of this test (ACL users are server-wide: named uniquely),
    with an empty ACL log; removed afterwards."""
    admin = redis.Redis(port=server.port)
    rs = roles(namespace, uuid.uuid4().hex[:6])
    install(admin, rs)
    admin.acl_log_reset()
    try:
        yield server, rs
    finally:
        remove(admin, rs)
        admin.close()
        chaos_app.app.close()
