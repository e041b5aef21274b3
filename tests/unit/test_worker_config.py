"""WorkerConfig is the last check before the loops: each bad setting is refused by name."""

from __future__ import annotations

import pytest
from duetime.common.errors import InvalidInput
from duetime.worker.config import WorkerConfig


def test_defaults_are_valid():
    cfg = WorkerConfig(queues=["default", "mail"])
    assert cfg.lease_ms == 10_000 and cfg.concurrency == 16 and cfg.log_error_text


@pytest.mark.parametrize(("field", "value", "says"), [
    ("lease_ms", 0, "lease_ms must be in 100.."),
    ("lease_ms", -5, "lease_ms must be in 100.."),
    ("lease_ms", 99, "lease_ms must be in 100.."),
    ("lease_ms", 2.5, "lease_ms must be an integer"),
    ("lease_ms", True, "lease_ms must be an integer"),
    ("concurrency", 0, "concurrency must be in 1.."),
    ("concurrency", 100_000, "concurrency must be in 1.."),
    ("concurrency", "8", "concurrency must be an integer"),
    ("grace_s", -1.0, "grace_s must be in 0.."),
    ("grace_s", float("nan"), "grace_s must be a finite number"),
    ("grace_s", float("inf"), "grace_s must be a finite number"),
    ("refresh_s", 0.0, "refresh_s must be in 0.01.."),
    ("refresh_s", -1, "refresh_s must be in 0.01.."),
    ("claim_ahead_ms", -1, "claim_ahead_ms must be in 0.."),
    ("claim_ahead_ms", 10_000, "shorter than the lease"),
    ("queues", [], "queues must be a non-empty list"),
    ("queues", "default", "queues must be a non-empty list"),
    ("queues", ["a", "a"], "must not repeat"),
    ("queues", ["a|b"], "'|'"),
    ("queues", ["a,b"], "','"),
    ("queues", ["has space"], "whitespace"),
    ("worker_id", "", "worker id must be a non-empty string"),
])
def test_bad_settings_are_refused_with_their_name(field, value, says):
    settings = {"queues": ["default"], field: value}
    with pytest.raises(InvalidInput, match=None) as info:
        WorkerConfig(**settings)
    assert says in str(info.value), str(info.value)


def test_a_setting_changed_after_construction_is_caught_by_validate():
    cfg = WorkerConfig(queues=["default"])
    cfg.lease_ms = 0
    with pytest.raises(InvalidInput, match="lease_ms"):
        cfg.validate()


@pytest.mark.parametrize(("env", "logged"), [(None, True), ("1", True), ("0", False),
                                              ("false", False), ("off", False)])
def test_error_text_in_logs_follows_the_environment(monkeypatch, env, logged):
    if env is None:
        monkeypatch.delenv("DUETIME_LOG_ERROR_TEXT", raising=False)
    else:
        monkeypatch.setenv("DUETIME_LOG_ERROR_TEXT", env)
    assert WorkerConfig(queues=["default"]).log_error_text is logged
