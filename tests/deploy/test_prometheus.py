"""promtool (Debian's `prometheus` package, installed by .ci/run) checks the alert rules, runs
their unit tests, checks the compose stack's Prometheus configuration as it is mounted, and
parses the autoscaler's query. CI must run these: only a developer machine without promtool
skips them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.files import COMPOSE, RULES, objects_of_kind
from tests.unit.test_deploy import rule_blocks


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: .ci/run installs Debian's `prometheus` package")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); CI runs this")
    return path


def run(promtool: str, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_the_alert_rules_pass_promtool(promtool: str):
    out = run(promtool, "check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rule_blocks())} rules found" in out.stdout


def test_the_alert_rules_unit_tests_pass(promtool: str):
    tests = RULES.with_name("duetime-rules.test.yml")
    alerts = {t["alertname"] for group in yaml.safe_load(tests.read_text())["tests"]
              for t in group["alert_rule_test"]}
    assert "DuetimeNoLiveWorkers" in alerts
    out = run(promtool, "test", "rules", tests)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_rule_fails_promtool(promtool: str, tmp_path: Path):
    """promtool does parse the expressions: one broken parenthesis is an error."""
    broken = RULES.read_text().replace("unless on () (max(duetime_workers_live) > 0)",
                                       "unless on () (max(duetime_workers_live) > 0")
    assert broken != RULES.read_text()
    (tmp_path / "rules.yml").write_text(broken)
    assert run(promtool, "check", "rules", tmp_path / "rules.yml").returncode != 0


def test_the_compose_prometheus_config_as_mounted(promtool: str, tmp_path: Path):
    """The config and the rules laid out as compose mounts them under /etc/prometheus."""
    volumes = yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"]["volumes"]
    for v in volumes:
        source, target = v.split(":")[:2]
        assert target.startswith("/etc/prometheus/"), v
        dest = tmp_path / target.removeprefix("/etc/prometheus/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(COMPOSE.parent / source, dest)
    out = run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and f"{len(rule_blocks())} rules found" in out.stdout


def test_the_autoscaler_query_is_valid_promql(promtool: str, tmp_path: Path):
    (scaled,) = objects_of_kind("ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    rules = {"groups": [{"name": "keda", "rules": [{"record": "duetime:worker_demand",
                                                     "expr": trigger["metadata"]["query"]}]}]}
    (tmp_path / "keda.yml").write_text(yaml.safe_dump(rules))
    out = run(promtool, "check", "rules", tmp_path / "keda.yml")
    assert out.returncode == 0, out.stdout + out.stderr
