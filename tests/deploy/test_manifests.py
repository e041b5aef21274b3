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
import yaml
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
CORE_KINDS = {"ConfigMap", "Secret", "Deployment", "PodDisruptionBudget", "Service",
              "ServiceAccount", "NetworkPolicy"}
OPTIONAL = ROOT / "deploy" / "kubernetes" / "optional"


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


def roles() -> dict[str, dict[str, Any]]:
    """The Deployments by the duetime command they run: worker, scheduler, web (the console)."""
    return {container(d)["args"][0]: d for d in objects("Deployment").values()}


def test_workers_get_longer_than_their_grace_to_stop_and_are_probed_on_duetimes_endpoints():
    for name, dep in roles().items():
        if name == "web":
            continue  # the console has no metrics port: its own test below
        c = container(dep)
        args = c["args"]
        helped = duetime_help(args)
        assert helped.returncode == 0, (name, helped.stderr)
        port = int(option(args, "--metrics-port"))
        assert option(args, "--metrics-host") == "0.0.0.0"  # probed and scraped from outside
        assert [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"] == [port]
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        # liveness waits for the startup probe: a slow import of the task code is not a crash
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 30
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
    by_role = roles()
    assert set(by_role) == {"scheduler", "worker", "web"}
    assert by_role["scheduler"]["spec"]["replicas"] >= 2
    budgets = objects("PodDisruptionBudget")
    assert len(budgets) == 2
    for dep in (by_role["scheduler"], by_role["worker"]):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (pdb,) = [b for b in budgets.values()
                  if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        if container(dep)["args"][0] == "scheduler":
            assert pdb["spec"]["minAvailable"] >= 1


def test_the_redis_url_comes_from_a_secret_and_the_namespace_from_a_config_map():
    maps, secrets = objects("ConfigMap"), objects("Secret")
    for dep in roles().values():
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


def test_the_compose_console_is_the_console_stage_on_loopback_and_read_only_by_default():
    svc = compose()["services"]["console"]
    assert svc["build"]["target"] == "console" and "console" in dockerfile()
    argv = svc["command"]
    assert argv[0] == "web" and duetime_help(argv).returncode == 0
    port = option(argv, "--port")
    assert svc["ports"] == [f"127.0.0.1:{port}:{port}"]  # published on the host's loopback only
    # an empty token is no token (read-only) unless the operator sets one
    assert svc["environment"]["DUETIME_WEB_WRITE_TOKEN"] == "${DUETIME_WEB_WRITE_TOKEN:-}"
    assert f"127.0.0.1:{port}/readyz" in " ".join(svc["healthcheck"]["test"])


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
        for m in re.finditer(r"rediss?://[\w-]*:([^@\s]+)@", path.read_text()):
            assert m.group(1) == "change-me", (path, m.group(0))


# -- the console, pods' identity, network, monitoring, autoscaling without KEDA ----------
def test_the_console_is_read_only_unless_its_token_secret_exists_and_is_probed_with_a_known_host():
    dep = roles()["web"]
    c = container(dep)
    helped = duetime_help(c["args"])
    assert helped.returncode == 0, helped.stderr
    assert option(c["args"], "--host") == "0.0.0.0"
    (token,) = [e for e in c["env"] if e["name"] == "DUETIME_WEB_WRITE_TOKEN"]
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is True  # no Secret, no token: read-only
    # the Secret that unlocks writes is not among the manifests applied by default
    assert ref["name"] not in objects("Secret")
    (optional_secret,) = yaml.safe_load_all((OPTIONAL / "console-write-token.yaml").read_text())
    assert optional_secret["metadata"]["name"] == ref["name"]
    assert set(optional_secret["stringData"]) == {ref["key"]}
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(optional_secret, version, strict=True)
    # its image is the Dockerfile's console stage, with the web extra
    assert c["image"] == f"duetime-console:{VERSION}" and "console" in dockerfile()
    # probes carry a Host the console answers to (it refuses unknown names: DNS rebinding)
    allowed = {"localhost", "127.0.0.1", "::1", *[c["args"][i + 1] for i, a in
                                                   enumerate(c["args"]) if a == "--allowed-host"]}
    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and get["port"] == "http", probe
        (host,) = [h["value"] for h in get["httpHeaders"] if h["name"] == "Host"]
        assert host in allowed, probe
    # its Service answers on the container's port, and the Service's name is an allowed host
    (svc,) = [s for s in objects("Service").values()
              if s["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]]
    assert svc["metadata"]["name"] in allowed
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["http"]


def test_no_pod_mounts_a_kubernetes_api_token():
    (account,) = objects("ServiceAccount").values()
    assert account["automountServiceAccountToken"] is False
    for name, dep in objects("Deployment").items():
        pod = dep["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account["metadata"]["name"], name
        assert pod["automountServiceAccountToken"] is False, name


def test_workers_spread_over_nodes():
    pod = roles()["worker"]["spec"]["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    labels = roles()["worker"]["spec"]["template"]["metadata"]["labels"]
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def test_network_policies_admit_scrapes_and_probes_and_keep_worker_egress_open():
    pods = {name: (d["spec"]["template"]["metadata"]["labels"], container(d))
            for name, d in roles().items()}
    policies = objects("NetworkPolicy").values()
    for role, (labels, c) in pods.items():
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        ingress = [p for p in mine if "Ingress" in p["spec"]["policyTypes"]]
        assert ingress, role  # every pod's ingress is restricted...
        port_names = {p["name"] for p in c["ports"]}
        opened = {port["port"] for p in ingress for rule in p["spec"]["ingress"]
                  for port in rule["ports"]}
        assert opened and opened <= port_names, (role, opened)  # ...to its own named ports
        egress = [p for p in mine if "Egress" in p["spec"]["policyTypes"]]
        if role == "worker":
            assert egress == []  # tasks call what they call
        else:
            ports = {port["port"] for p in egress for rule in p["spec"]["egress"]
                     for port in rule["ports"]}
            assert {6379, 53} <= ports, role


SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    # the part of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1) used here
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["selector", "endpoints"],
                 "properties": {
                     "selector": {"type": "object", "required": ["matchLabels"]},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string",
                                                     "pattern": r"^[0-9]+[smh]$"}}}}}},
    },
}


def test_the_service_monitor_scrapes_the_metrics_port_of_workers_and_schedulers():
    (monitor,) = objects("ServiceMonitor").values()
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    services = [s for s in objects("Service").values()
                if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    covered = set()
    for svc in services:
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
        for role, dep in roles().items():
            if _selects({"matchLabels": svc["spec"]["selector"]},
                        dep["spec"]["template"]["metadata"]["labels"]):
                covered.add(role)
                (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
                assert port["targetPort"] in {p["name"] for p in container(dep)["ports"]}
    assert covered == {"worker", "scheduler"}


def test_the_autoscalers_target_one_worker_per_concurrency_worth_of_runs():
    """KEDA's threshold and the HPA's per-pod target equal the worker's --concurrency: as many
    workers as it takes to run everything waiting and running at once."""
    concurrency = option(container(roles()["worker"])["args"], "--concurrency")
    (scaled,) = objects("ScaledObject").values()
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["threshold"] == concurrency
    (hpa,) = yaml.safe_load_all((OPTIONAL / "hpa.yaml").read_text())
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    assert hpa["spec"]["scaleTargetRef"]["name"] == roles()["worker"]["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["target"]["averageValue"] == concurrency
    assert hpa["spec"]["minReplicas"] >= 1
    # the adapter rule in its comment computes what the ScaledObject's query does
    assert trigger["metadata"]["query"] in (OPTIONAL / "hpa.yaml").read_text()
