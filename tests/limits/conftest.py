"""Every test here proves claim.lua's limits (concurrency, rate, fairness, priority, tenants):
each module is marked `scripts`, so it runs on Redis, Valkey and the in-memory backend (see
tests/conftest.py). The mark is given here, for the whole folder, rather than in each module."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> Generator[
        None, pytest.Module | None, pytest.Module | None]:
    module = yield
    if module is not None:
        module.add_marker(pytest.mark.scripts)
        if module_path.name == "test_cluster_limits.py":
            module.add_marker(pytest.mark.slow)  # a three-primary cluster per kind
    return module
