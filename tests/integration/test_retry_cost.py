"""The cost of retries is visible: a task of owner `billing` failing twice then succeeding
shows its attempts and the time its failed attempts took, on the worker's /metrics and in
`duetime top` (a separate process, reading what the worker added to Redis)."""

from __future__ import annotations

from duetime.common import metrics
from duetime.common.retrycost import Ledger, commands, field, read

from duetime.embedded import free_port
from tests.apps import basic
from tests.conftest import wait_for
from tests.integration.opkit import as_json, cli, ok
from tests.integration.test_metrics import _up, scrape, value

TASK = "billing.flaky"


def test_a_flaky_billing_task_s_retry_cost_in_metrics_and_top(app, url, namespace, procs):
    port = free_port()
    procs.worker("--metrics-port", str(port), "--queues", "default")
    wait_for(lambda: _up(port), 20, what="worker metrics endpoint")
    before = scrape(port)  # preset at 0, labelled with the task's owner
    for ending in ("succeeded", "failed", "interrupted"):
        assert value(before, "duetime_attempts_total", task=TASK, owner="billing",
                     ending=ending) == 0
    assert value(before, "duetime_failed_attempt_seconds_total", task=TASK, owner="billing") == 0
    assert value(before, "duetime_attempts_total", task="noop", owner="", ending="failed") == 0

    run_id = app.enqueue(basic.billing_flaky, [0.2])
    assert app.wait(run_id, timeout=30) == "charged"
    assert app.get_run(run_id).attempt == 3

    def attempts(s, ending: str) -> float | None:
        return value(s, "duetime_attempts_total", task=TASK, owner="billing", ending=ending)

    wait_for(lambda: attempts(scrape(port), "succeeded") == 1, 10, what="success counted")
    after = scrape(port)
    assert attempts(after, "failed") == 2 and attempts(after, "interrupted") == 0
    failed_s = value(after, "duetime_failed_attempt_seconds_total", task=TASK, owner="billing")
    assert failed_s is not None and 0.4 <= failed_s < 30  # two attempts of 0.2 s of work each

    # top reads the same numbers from Redis: the worker sends them within about a second
    def row() -> dict | None:
        frame = as_json(cli(url, namespace, "top", "--once", "--json"))
        rows = [r for r in frame["retry_cost"] if r["task"] == TASK]
        return rows[0] if rows and rows[0]["attempts"] == 3 else None

    wait_for(lambda: row() is not None, 10, what="retry cost in top")
    r = row()
    assert r["owner"] == "billing" and r["failed"] == 2
    assert 0.4 <= r["failed_s"] < 30 and abs(r["failed_s"] - failed_s) < 0.05
    assert r["recent_attempts"] == 3 and r["recent_failed"] == 2  # within top's window
    text = ok(cli(url, namespace, "top", "--once"))
    assert "retry cost per task" in text
    line = next(line for line in text.splitlines() if line.startswith(TASK))
    assert line.split()[:4] == [TASK, "billing", "3", "2"], line


def test_counts_that_could_not_be_written_are_kept_and_totals_add_up(app, r):
    ledger = Ledger()
    ledger.add("t", "team", "failed", 0.25)
    ledger.add("t", "team", "succeeded", 9.0)  # success time is not a retry cost
    ledger.add("t", "team", "interrupted", 0.5)
    taken = ledger.take()
    assert not ledger and taken == {("t", "team"): [3, 2, 750]}
    ledger.give_back(taken)
    ledger.add("u", "", "succeeded", 1)
    taken = ledger.take()
    now = 1_764_547_230_000
    for cmd in commands(app.keys, taken, now):
        r.execute_command(*cmd)
    for cmd in commands(app.keys, {("t", "team"): [1, 1, 100]}, now - 600_000):  # 10 min before
        r.execute_command(*cmd)
    assert r.hget(app.keys.cost, field("t", "team", "ms")) == b"850"
    assert 0 < r.pttl(app.keys.cost_minute(now // 60_000)) <= 86_460_000
    rows = {(c.task, c.owner): c for c in read(r, app.keys, now, window_s=60)}
    t, u = rows[("t", "team")], rows[("u", "")]
    assert (t.attempts, t.failed, t.failed_s) == (4, 3, 0.85)
    assert (t.recent_attempts, t.recent_failed, t.recent_failed_s) == (3, 2, 0.75)
    assert (u.attempts, u.failed, u.recent_attempts) == (1, 0, 1)
    assert list(rows)[0] == ("t", "team")  # costliest first
    metrics.preset(["preset.cost"], owners={"preset.cost": "ops"})
    reg = metrics.registry("worker")
    assert reg.get_sample_value("duetime_failed_attempt_seconds_total",
                                {"task": "preset.cost", "owner": "ops"}) == 0
