"""deploy/: the alert rules and the dashboard use only metrics duetime exports, and the
metrics follow Prometheus conventions (base units, _total counters)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from duetime.common import metrics
from prometheus_client import Counter, Gauge, Histogram

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bduetime_[a-z_]+\b")


def exported() -> dict[str, str]:
    """Every sample name duetime's metrics expose → its metric type."""
    out: dict[str, str] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, Counter | Gauge | Histogram):
            for m in obj.describe():
                suffixes = {"counter": ("_total",), "gauge": ("",),
                            "histogram": ("_bucket", "_count", "_sum")}[m.type]
                for s in suffixes:
                    out[m.name + s] = m.type
    return out


def test_metric_names_follow_conventions():
    names = exported()
    assert names, "no metrics found"
    for name, kind in names.items():
        assert name.startswith("duetime_")
        if kind == "histogram":
            assert re.search(r"_seconds_(bucket|count|sum)$", name), name  # base unit: seconds
        assert not re.search(r"_(ms|milliseconds|minutes)(_|$)", name), name


def rule_blocks() -> list[dict[str, str]]:
    """The alert rules, read without a YAML library: one dict of top-level fields per rule."""
    text = (DEPLOY / "prometheus" / "duetime-rules.yml").read_text()
    blocks = []
    for chunk in text.split("- alert: ")[1:]:
        fields = {"alert": chunk.splitlines()[0].strip()}
        for key in ("expr", "for", "severity", "summary", "description", "runbook_url"):
            m = re.search(rf"^\s+{key}: (.+)$", chunk, re.M)
            fields[key] = m.group(1).strip() if m else ""
        blocks.append(fields)
    return blocks


def test_alert_rules_cover_the_failure_modes_and_use_real_metrics():
    names = exported()
    rules = rule_blocks()
    alerts = {r["alert"] for r in rules}
    assert len(alerts) == len(rules)
    assert {"DuetimeDeadLettersRising", "DuetimeStartLatenessHigh", "DuetimeLeaseExpiries",
            "DuetimePartitionUnowned", "DuetimeNoScheduler", "DuetimeBacklogOld",
            "DuetimeNoLiveWorkers"} <= alerts
    for r in rules:
        assert r["expr"] and r["for"] and r["severity"] in ("info", "warning", "critical"), r
        assert r["summary"] and r["description"], r
        used = set(METRIC.findall(r["expr"]))
        assert used and used <= names.keys(), (r["alert"], used - names.keys())
        assert r["expr"].count("(") == r["expr"].count(")"), r["alert"]


def test_every_alert_links_its_runbook_section_and_every_section_has_an_alert():
    """runbook_url is `<site>/runbooks/#<alert in lower case>`: the anchor MkDocs gives the
    heading `## <Alert>` of docs/runbooks.md."""
    runbooks = (DEPLOY.parent / "docs" / "runbooks.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", runbooks, re.M))
    rules = rule_blocks()
    assert sections == {r["alert"] for r in rules}
    for r in rules:
        url = r["runbook_url"].strip('"')
        assert url.endswith(f"/runbooks/#{r['alert'].lower()}"), (r["alert"], url)
        section = runbooks.split(f"## {r['alert']}\n", 1)[1].split("\n## ", 1)[0]
        assert "**Means:**" in section and "**Fix:**" in section, r["alert"]


def test_dashboard_panels_use_real_metrics():
    names = exported()
    dash = json.loads((DEPLOY / "grafana" / "duetime-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= names.keys(), used - names.keys()
    # every metric family docs/reference/metrics.md lists for operators is on the dashboard
    for family in ("duetime_runs_finished_total", "duetime_start_lateness_seconds_bucket",
                   "duetime_queue_delay_seconds_bucket", "duetime_execution_duration_seconds_bucket",
                   "duetime_lease_expiries_total", "duetime_late_results_rejected_total",
                   "duetime_retries_total", "duetime_dead_letters_total", "duetime_queue_backlog",
                   "duetime_queue_oldest_due_age_seconds", "duetime_leases_active",
                   "duetime_scheduler_partitions_owned", "duetime_runs_materialized_total",
                   "duetime_runs_missed_total", "duetime_runs_skipped_total",
                   "duetime_failed_attempt_seconds_total", "duetime_attempts_total"):
        assert family in used, family
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24


def test_dashboard_and_rules_group_by_labels_their_metrics_have():
    """`sum by (ending) (rate(duetime_attempts_total[5m]))`: a label the metric does not have
    plots one nameless line, silently; a renamed label must be renamed here too."""
    labels: dict[str, set[str]] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, Counter | Gauge | Histogram):
            for m in obj.describe():
                for s in ("", "_total", "_bucket", "_count", "_sum"):
                    labels[m.name + s] = set(obj._labelnames) | ({"le"} if s == "_bucket" else set())
    dash = json.loads((DEPLOY / "grafana" / "duetime-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [r["expr"] for r in rule_blocks()]
    grouped = re.compile(r"by \(([^)]*)\) \((?:\w+\()?(duetime_[a-z_]+)")
    seen = 0
    for e in exprs:
        for by, name in grouped.findall(e):
            wanted = {x.strip() for x in by.split(",")}
            assert wanted <= labels[name], (e, wanted - labels[name])
            seen += 1
    assert seen >= 15
