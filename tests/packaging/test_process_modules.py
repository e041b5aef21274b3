"""A running `duetime worker` or `duetime scheduler` loads only what it runs: none of the
operator tools (doctor, key guide, surge lint, admin, listings, renderers), the console, or the
modules of other commands. What a long-lived process imports is what it can break on, what it
keeps in memory, and what a deploy of an operator-tool change forces it to restart for."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from duetime.common.keys import Keyspace

from tests.conftest import ROOT, wait_for

# modules no worker or scheduler process may load
FORBIDDEN_PREFIXES = ("duetime.ops", "duetime.web", "duetime.testing", "duetime.embedded",
                      "duetime.demo", "duetime.dev", "duetime.supervise")
CLI_MODULES = {"duetime.cli", "duetime.cli.common"}


def _loaded(tmp_path: Path, url: str, namespace: str, args: list[str],
            serving: Callable[[], object]) -> set[str]:
    out = tmp_path / "modules.txt"
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT), "DUETIME_MODULES_OUT": str(out)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.apps.module_probe", "--log-level",
                             "WARNING", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: serving() or proc.poll() is not None, timeout=30, what="the process serving")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        Path(f"{out}.go").touch()
        wait_for(out.exists, timeout=30, what="the module list")
        return set(out.read_text().split())
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _check(loaded: set[str], own_command: str) -> None:
    forbidden = sorted(m for m in loaded if m.startswith(FORBIDDEN_PREFIXES))
    other_commands = sorted(m for m in loaded if m.split(".")[:2] == ["duetime", "cli"]
                            and m not in CLI_MODULES | {own_command})
    assert forbidden == []
    assert other_commands == []
    assert own_command in loaded  # the probe saw the real process, not an empty interpreter


@pytest.fixture
def valkey_url(servers) -> str:
    return servers["valkey"].url  # Python logic: one server kind is enough


def test_a_worker_loads_no_operator_console_or_other_command_module(tmp_path, valkey_url, namespace):
    keys = Keyspace(namespace)
    client = redis.Redis.from_url(valkey_url)
    loaded = _loaded(tmp_path, valkey_url, namespace, ["worker", "--app", "tests.apps.basic:app"],
                     lambda: client.zcard(keys.workers) > 0)
    _check(loaded, "duetime.cli.worker")
    assert "duetime.worker.runtime" in loaded


def test_a_scheduler_loads_no_operator_console_or_other_command_module(tmp_path, valkey_url, namespace):
    keys = Keyspace(namespace)
    client = redis.Redis.from_url(valkey_url)
    loaded = _loaded(tmp_path, valkey_url, namespace, ["scheduler"],
                     lambda: any(f.startswith(b"p:") for f in client.hkeys(keys.owners)))
    _check(loaded, "duetime.cli.scheduler")
    assert {"duetime.scheduler.evaluator", "duetime.scheduler.reaper"} <= loaded


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("folder", ["scheduler", "worker"])
def test_scheduler_and_worker_code_imports_no_producer_module(folder):
    """The scheduler's and the worker's own code reach the producer side (duetime.client,
    duetime/client/) through nothing: what they run (the dependency relay, the claims) lives
    in their own folder or in common/, so a producer-side change is no change to them."""
    offenders = sorted(f"{path.relative_to(ROOT)}: {m}" for path in (ROOT / folder).glob("*.py")
                       for m in _imports(path)
                       if m == "duetime.client" or m.startswith("duetime.client."))
    assert offenders == []
