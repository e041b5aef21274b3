"""Each metric belongs to the process that reports it; one left out of every role would never
be exported."""

from __future__ import annotations

from duetime.common import metrics
from prometheus_client.metrics import MetricWrapperBase


def test_every_metric_is_exported_by_some_role():
    defined = {name for name, v in vars(metrics).items() if isinstance(v, MetricWrapperBase)}
    in_roles = {name for name, v in vars(metrics).items()
                if any(v is m for role in metrics.ROLES.values() for m in role)}
    assert len(defined) > 20 and defined == in_roles


def test_a_role_registry_holds_only_its_metrics():
    worker = {m.name for m in metrics.registry("worker").collect()}
    scheduler = {m.name for m in metrics.registry("scheduler").collect()}
    assert "duetime_worker_inflight_runs" in worker and "duetime_worker_inflight_runs" not in scheduler
    assert "duetime_queue_backlog" in scheduler and "duetime_queue_backlog" not in worker
    assert "duetime_runs_missed" in worker & scheduler  # both count misses
    assert "process_cpu_seconds" in worker


def test_preset_creates_each_task_and_queue_series_at_zero():
    metrics.preset(["preset.task"], ["preset-queue"])
    reg = metrics.registry("worker")
    assert reg.get_sample_value("duetime_runs_finished_total",
                                {"task": "preset.task", "outcome": "dead"}) == 0
    assert reg.get_sample_value("duetime_runs_claimed_total", {"queue": "preset-queue"}) == 0
    assert reg.get_sample_value("duetime_start_lateness_seconds_count",
                                {"queue": "preset-queue"}) == 0


def test_one_vocabulary_per_label_name():
    """A label name means one set of words in every metric that has it (the attempts' endings
    are `ending`, not a second meaning of `outcome`): after `preset`, the values a label takes
    are the same wherever it is used."""
    from duetime.common.outcomes import Outcome
    from duetime.common.retrycost import ATTEMPT_ENDINGS

    metrics.preset(["vocab.task"], ["vocab-queue"], {"vocab.task": "team"})
    words: dict[str, dict[str, set[str]]] = {}  # label -> metric -> its values
    for role in ("worker", "scheduler"):
        for family in metrics.registry(role).collect():
            for s in family.samples:
                for label, v in s.labels.items():
                    if label in ("outcome", "ending", "limit", "result"):
                        words.setdefault(label, {}).setdefault(family.name, set()).add(v)
    for label, per_metric in words.items():
        assert len({frozenset(v) for v in per_metric.values()}) == 1, (label, per_metric)
    assert set(words["outcome"]["duetime_runs_finished"]) == {o.value for o in Outcome}
    assert set(words["ending"]["duetime_attempts"]) == set(ATTEMPT_ENDINGS)
