"""Fixtures of the integration tests: an app of the test's own (middleware registered on it
stays on it), on the test's server and namespace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import duetime


@pytest.fixture
def own_app(url: str, namespace: str) -> Iterator[duetime.App]:
    app = duetime.App(redis_url=url, namespace=namespace)
    yield app
    app.close()
