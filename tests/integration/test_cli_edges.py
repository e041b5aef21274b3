"""CLI edges: each refusal is one `error:` line, exit 2, and nothing written to Redis."""

from __future__ import annotations

import pytest

from tests.integration.opkit import cli

APP = "tests.apps.basic:app"


def refused(res, words: str) -> None:  # type: ignore[no-untyped-def]
    lines = (res.stderr or "").strip().splitlines()
    assert res.exit_code == 2, (res.exit_code, res.stderr, res.stdout)
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines


@pytest.mark.parametrize(("args", "words"), [
    (["worker", "--app", APP, "--queues", ","], "names no queue"),
    (["worker", "--app", APP, "--queues", "a:0"], "weight must be an integer in 1..1000"),
    (["worker", "--app", APP, "--queues", "high:-1"], "got '-1'"),
    (["worker", "--app", APP, "--metrics-port", "9", "--metrics-host", "no such host!"],
     "metrics host"),
])
def test_worker_options_are_checked_before_anything_is_written(url, namespace, r, args, words):
    refused(cli(url, namespace, *args), words)
    assert r.keys(f"{namespace}:*") == []


def test_an_empty_namespace_is_refused_not_taken_for_the_default(url, r):
    before = set(r.keys("duetime:*"))
    refused(cli(url, "", "enqueue", "noop", "--app", APP), "--namespace")
    assert set(r.keys("duetime:*")) == before


def test_web_host_and_demo_runs_are_checked(url, namespace):
    refused(cli(url, namespace, "web", "--host", "not a host"), "--host")
    refused(cli(url, namespace, "demo", "--runs", "-1"), "--runs")


def test_tz_without_cron_is_refused(url, namespace, r):
    refused(cli(url, namespace, "schedule", "add", "s", "--every", "1m", "--tz", "Europe/Paris",
                "--task", "noop", "--app", APP), "--tz applies to --cron only")
    assert r.keys(f"{namespace}:*") == []


def test_a_schedule_firing_more_than_once_a_second_is_warned_about(url, namespace):
    res = cli(url, namespace, "schedule", "add", "fast", "--every", "1ms", "--task", "noop",
              "--app", APP)
    assert res.exit_code == 0, res.stderr
    warnings = [x for x in res.stderr.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "more than once a second" in warnings[0], res.stderr
    res = cli(url, namespace, "schedule", "add", "calm", "--every", "1s", "--task", "noop",
              "--app", APP)
    assert res.exit_code == 0 and "warning:" not in res.stderr, res.stderr


def test_names_refuse_unicode_format_characters_and_owner_is_bounded():
    from duetime.common.tasks import TaskSpec

    import duetime

    with pytest.raises(duetime.InvalidInput, match="U\\+202E"):
        TaskSpec(name="evil\u202egnp.exe")
    with pytest.raises(duetime.InvalidInput, match="U\\+200B"):
        TaskSpec(name="a", queue="q\u200b")
    with pytest.raises(duetime.InvalidInput, match="longer than 100"):
        TaskSpec(name="a", owner="x" * 101)
    with pytest.raises(duetime.InvalidInput):
        TaskSpec(name="a", owner="team\u202e")
    assert TaskSpec(name="café", owner="team payments").owner == "team payments"
