"""deploy/'s Kubernetes manifests, compose file and systemd units, checked offline: against
their schemas (kubernetes-validate, the compose-spec schema that check-jsonschema ships), and
against duetime itself (every command line parses, grace periods outlast --grace, probes hit the
endpoints duetime serves, the autoscaler reads metrics duetime exports)."""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from duetime.common.time.parse import parse_duration

from tests.conftest import ROOT
from tests.deploy.files import (
    COMPOSE,
    DOCKERFILE,
    SYSTEMD,
    compose,
    dockerfile,
    duetime_help,
    kubernetes_objects,
    option,
    systemd_unit,
)
from tests.unit.test_deploy import METRIC, exported


def parse_seconds(text: str) -> float:
    return parse_duration(text).total_seconds()

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# the oldest Kubernetes the manifests claim (policy/v1 PDB with unhealthyPodEvictionPolicy
# is GA from 1.31 on), and the newest kubernetes-validate knows
K8S_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
CORE_KINDS = {"ConfigMap", "Secret", "Deployment", "PodDisruptionBudget"}


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for _, o in kubernetes_objects() if o["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


# -- Kubernetes ---------------------------------------------------------------------------
def test_every_core_object_is_valid_kubernetes_strictly():
    kinds = set()
    for _, obj in kubernetes_objects():
        if obj["kind"] not in CORE_KINDS:
            continue
        kinds.add(obj["kind"])
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)  # raises on any error
    assert kinds == CORE_KINDS


def test_strict_validation_would_catch_a_misspelt_field():
    """The check above is worth something: a field Kubernetes would ignore is an error here."""
    worker = copy.deepcopy(objects("Deployment")["duetime-worker"])
    spec = worker["spec"]["template"]["spec"]
    spec["terminationGracePeriod"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        kubernetes_validate.validate(worker, K8S_VERSIONS[0], strict=True)


SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    # the part of KEDA's ScaledObject (keda.sh/v1alpha1) these manifests use; kubernetes-validate
    # has no schemas for custom resources
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                                  "apiVersion": {"type": "string"}}},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {"type": "object"},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "metadata"],
                    "properties": {"type": {"const": "prometheus"}, "metadata": {
                        "type": "object", "additionalProperties": {"type": "string"},
                        "required": ["serverAddress", "query", "threshold"],
                        "properties": {"threshold": {"type": "string",
                                                     "pattern": r"^[0-9]+(\.[0-9]+)?$"}}}}}},
            },
        },
    },
}


def test_the_worker_autoscaler_targets_the_worker_deployment_on_exported_metrics():
    (scaled,) = objects("ScaledObject").values()
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] in objects("Deployment")
    assert container(objects("Deployment")[spec["scaleTargetRef"]["name"]])["args"][0] == "worker"
    assert spec["minReplicaCount"] >= 1 and spec["maxReplicaCount"] > spec["minReplicaCount"]
    (trigger,) = spec["triggers"]
    used = set(METRIC.findall(trigger["metadata"]["query"]))
    assert "duetime_queue_backlog" in used
    assert used <= exported().keys(), used - exported().keys()


def test_workers_get_longer_than_their_grace_to_stop_and_are_probed_on_duetimes_endpoints():
    deployments = objects("Deployment")
    for name, dep in deployments.items():
        c = container(dep)
        args = c["args"]
        helped = duetime_help(args)
        assert helped.returncode == 0, (name, helped.stderr)
        port = int(option(args, "--metrics-port"))
        assert option(args, "--metrics-host") == "0.0.0.0"  # probed and scraped from outside
        assert [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"] == [port]
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        image_user = dockerfile()["duetime"].last("USER")  # the uid the image was built with
        assert image_user is not None
        assert str(pod["securityContext"]["runAsUser"]) == image_user.args.split(":")[0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["image"].endswith(f":{VERSION}")
        if args[0] == "worker":
            assert "--processes" not in args  # Kubernetes restarts and scales pods
            assert pod["terminationGracePeriodSeconds"] > parse_seconds(option(args, "--grace"))


def test_two_schedulers_and_budgets_that_keep_them_and_the_workers_up():
    deployments = objects("Deployment")
    roles = {container(d)["args"][0]: d for d in deployments.values()}
    assert set(roles) == {"scheduler", "worker"}
    assert roles["scheduler"]["spec"]["replicas"] >= 2
    budgets = objects("PodDisruptionBudget")
    assert len(budgets) == 2
    for dep in deployments.values():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (pdb,) = [b for b in budgets.values()
                  if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        if container(dep)["args"][0] == "scheduler":
            assert pdb["spec"]["minAvailable"] >= 1


def test_the_redis_url_comes_from_a_secret_and_the_namespace_from_a_config_map():
    maps, secrets = objects("ConfigMap"), objects("Secret")
    for dep in objects("Deployment").values():
        refs = container(dep)["envFrom"]
        (cm,) = [maps[r["configMapRef"]["name"]] for r in refs if "configMapRef" in r]
        (secret,) = [secrets[r["secretRef"]["name"]] for r in refs if "secretRef" in r]
        assert set(cm["data"]) == {"DUETIME_NAMESPACE"}
        assert set(secret["stringData"]) == {"DUETIME_REDIS_URL"}


# -- compose ------------------------------------------------------------------------------
def compose_schema() -> dict[str, Any]:
    """The compose-spec JSON schema as check-jsonschema vendors it (no network at test time)."""
    vendor = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
    return json.loads((vendor / "compose-spec.json").read_text())


def compose_errors(doc: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(doc)]


def test_the_compose_file_follows_the_compose_spec():
    assert compose_schema()["title"] == "Compose Specification"
    doc = compose()
    assert compose_errors(doc) == []
    broken = copy.deepcopy(doc)
    broken["services"]["worker"]["stop_grace"] = "45s"
    assert any("stop_grace" in e for e in compose_errors(broken))


def test_the_compose_services_build_from_the_dockerfile_and_run_as_documented():
    services = compose()["services"]
    assert {"redis", "scheduler", "worker", "prometheus"} <= services.keys()
    redis = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis and "--maxmemory-policy noeviction" in redis
    stages = dockerfile()
    for role in ("scheduler", "worker"):
        svc = services[role]
        build = svc["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT and (context / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] in stages
        assert svc["image"].endswith(f":{VERSION}")
        argv = svc["command"]
        assert argv[0] == role
        helped = duetime_help(argv)
        assert helped.returncode == 0, helped.stderr
        assert option(argv, "--metrics-host") == "0.0.0.0"
        assert svc["environment"]["DUETIME_REDIS_URL"].startswith("redis://redis:")
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "container_name" not in svc and "ports" not in svc  # replicas must not collide
    assert services["scheduler"]["deploy"]["replicas"] >= 2
    assert services["worker"]["build"]["target"] == "app"
    worker = services["worker"]["command"]
    assert parse_seconds(services["worker"]["stop_grace_period"]) > parse_seconds(option(worker, "--grace"))


def test_prometheus_in_compose_mounts_files_that_exist():
    mounts = compose()["services"]["prometheus"]["volumes"]
    for m in mounts:
        source = m.split(":")[0]
        assert (COMPOSE.parent / source).resolve().is_file(), m


# -- systemd ------------------------------------------------------------------------------
UNITS = sorted(SYSTEMD.glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_units_run_a_command_duetime_takes_and_outlast_its_grace(unit: Path):
    service = systemd_unit(unit)["Service"]
    (exec_start,) = service["ExecStart"]
    argv = exec_start.split()
    assert argv[0] == "/opt/duetime/bin/duetime"
    helped = duetime_help(argv[1:])
    assert helped.returncode == 0, helped.stderr
    stop = parse_seconds(service["TimeoutStopSec"][0] + "s")
    assert service["RestartPreventExitStatus"] == ["2"]  # bad options: restarting will not help
    assert service["User"] != ["root"] and service["NoNewPrivileges"] == ["yes"]
    if argv[1] == "worker":
        assert stop > parse_seconds(option(argv, "--grace"))
        if "--processes" in argv:
            # the supervisor forwards SIGTERM once; a signal to every process would double it
            assert service["KillMode"] == ["mixed"]


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_finds_nothing_to_say(unit: Path, tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd); the unit's own fields "
                    "are checked by the test above")
    duetime = Path(sys.executable).parent / "duetime"  # this virtualenv's, in place of /opt/duetime's
    assert duetime.is_file()
    copy_ = tmp_path / unit.name
    copy_.write_text(unit.read_text().replace("/opt/duetime/bin/duetime", str(duetime)))
    out = subprocess.run([analyze, "verify", str(copy_)], capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values: it only says so
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if str(copy_) in ln or unit.name in ln]
    assert out.returncode == 0 and lines == [], out.stdout + out.stderr


def test_the_systemd_environment_file_names_only_duetimes_variables():
    env = (SYSTEMD / "duetime.env").read_text()
    keys = {ln.split("=", 1)[0] for ln in env.splitlines() if ln and not ln.startswith("#")}
    assert keys == {"DUETIME_REDIS_URL", "DUETIME_NAMESPACE"}
    for unit in UNITS:
        assert systemd_unit(unit)["Service"]["EnvironmentFile"] == ["/etc/duetime/duetime.env"]


def test_no_secret_looking_value_but_placeholders():
    """The example URLs carry a placeholder password, never a real-looking one."""
    for path in [*Path(ROOT / "deploy").rglob("*.yaml"), *SYSTEMD.glob("*")]:
        for m in re.finditer(r"rediss?://:([^@\s]+)@", path.read_text()):
            assert m.group(1) == "change-me", (path, m.group(0))
