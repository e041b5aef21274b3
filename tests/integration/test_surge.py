"""Surges at common boundaries on a real server: 10,000 schedules at `0 * * * *`, `schedule
lint` finding the hour boundaries and the stagger that flattens them, the namespace's stagger
policy applied by the evaluator."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from duetime.common.schedules import stagger_for
from duetime.scheduler.evaluator import Evaluator

import duetime
from tests.apps import basic
from tests.integration.opkit import as_json, cli, ok, one_line_error
from tests.integration.test_schedules import occurrence, runs_of

APP = "tests.apps.basic:app"


def test_10000_hourly_schedules_surge_until_the_default_stagger_is_set(app, url, namespace):
    defs = [app.schedule_def(f"hourly-{i:05d}", duetime.Cron("0 * * * *"), basic.noop)
            for i in range(10_000)]
    assert set(app.schedule_many(defs)) == {"created"}

    def lint(*args: str) -> str:
        return ok(cli(url, namespace, "schedule", "lint", "--max-per-second", "500", *args))

    before = as_json(cli(url, namespace, "schedule", "lint", "--max-per-second", "500", "--json"))
    assert before["schedules"] == 10_000 and before["runs"] == 240_000
    assert before["evaluations"] == 1  # one walk for 10,000 identical expressions
    assert before["peak"] == 10_000 and before["over"] == 24 and not before["flat"]
    assert len(before["hot"]) == 10
    for spot in before["hot"]:  # every hot spot is an hour boundary holding all of them
        assert spot["count"] == 10_000 and spot["second"].endswith(":00:00Z"), spot
        assert spot["more"] == 9_995 and spot["schedules"][0] == "hourly-00000"
    suggested = before["suggestion"]["stagger_s"]
    assert suggested is not None and suggested >= 20  # 10,000 / 500 seconds at least
    width = f"{suggested:g}s" if suggested < 60 else None
    text = lint()
    assert "24 second(s) above 500" in text
    assert re.search(r"^\S+T\d\d:00:00Z\s+10000\s+hourly-00000", text, re.M), text
    assert "suggested stagger:" in text and "duetime schedule policy set --stagger" in text
    if width:
        assert f"--stagger {width}`" in text
    # doctor says it in one line (the next hour, against the default target: no worker runs)
    doctor = as_json(cli(url, namespace, "doctor", "--json"))
    (surge,) = [f for f in doctor["findings"] if f["check"] == "surges"]
    assert surge["level"] == "warn" and surge["message"].startswith("10000 runs due in one second")
    assert "schedule lint" in surge["advice"] and doctor["fatal"] is False

    # the policy the lint suggested, applied: every schedule follows it (none has its own)
    ok(cli(url, namespace, "schedule", "policy", "set", "--stagger", f"{suggested:g}s"))
    assert as_json(cli(url, namespace, "schedule", "policy", "show", "--json")) == {
        "stagger_s": suggested}
    after = as_json(cli(url, namespace, "schedule", "lint", "--max-per-second", "500", "--json"))
    assert after["flat"] and after["over"] == 0 and after["peak"] <= 500
    assert after["runs"] == 240_000 and after["policy_stagger_s"] == suggested
    assert after["suggestion"]["needed"] is False
    assert "flat: no second holds more than 500" in lint()


@pytest.mark.scripts  # proves its scripts: runs on every server kind
def test_the_evaluator_applies_own_stagger_policy_and_zero(app, url, namespace):
    every = duetime.Every(timedelta(seconds=1))
    app.schedule("st-auto", every, basic.noop)
    app.schedule("st-own", every, basic.noop, stagger="10s")
    app.schedule("st-zero", every, basic.noop, stagger=0)
    assert app.get_schedule("st-own").stagger_s == 10 and app.get_schedule("st-auto").stagger_s is None
    app.schedules.set_stagger_policy(20_000)
    ev = Evaluator(url, app.keys, lead_ms=1500)
    time.sleep(0.1)
    ev.tick()
    want = {"st-auto": stagger_for("st-auto", 20_000), "st-own": stagger_for("st-own", 10_000),
            "st-zero": 0}
    assert want["st-auto"] and want["st-own"]
    for name, offset in want.items():
        runs = runs_of(app, name)
        assert runs, name
        for run in runs:  # the same offset for every occurrence; the run id keeps the instant
            assert int(run.due.timestamp() * 1000) - occurrence(run) == offset, (name, run.id)
    # clearing the policy: runs made from then on are on time again
    app.schedules.set_stagger_policy(0)
    assert app.schedules.stagger_policy() == 0


def test_stagger_from_the_cli(app, url, namespace):
    base = ["schedule", "add", "st-cli", "--every", "1m", "--task", "noop", "--app", APP]
    ok(cli(url, namespace, *base, "--stagger", "45s"))
    shown = as_json(cli(url, namespace, "schedule", "show", "st-cli", "--json"))
    assert shown["stagger_s"] == 45
    assert shown["stagger_offset_s"] == stagger_for("st-cli", 45_000) / 1000 > 0
    text = ok(cli(url, namespace, "schedule", "show", "st-cli"))
    assert f"every run is due {stagger_for('st-cli', 45_000) / 1000:g}s after its fire time" in text
    assert ok(cli(url, namespace, *base, "--stagger", "auto")).startswith("updated st-cli")
    assert as_json(cli(url, namespace, "schedule", "show", "st-cli", "--json"))["stagger_s"] is None
    assert "the namespace policy (0 now)" in ok(cli(url, namespace, "schedule", "show", "st-cli"))
    app.schedules.set_stagger_policy(20_000)
    assert as_json(cli(url, namespace, "schedule", "show", "st-cli", "--json"))[
        "stagger_offset_s"] == stagger_for("st-cli", 20_000) / 1000
    # the same definition again (no --stagger: the policy, as `auto`) changes nothing
    assert ok(cli(url, namespace, *base)).startswith("unchanged st-cli")


def test_bad_stagger_input_is_one_line(url, namespace):
    err = one_line_error(cli(url, namespace, "schedule", "add", "x", "--every", "1m", "--task",
                             "noop", "--app", APP, "--stagger", "soon"), 2)
    assert "--stagger" in err
    err = one_line_error(cli(url, namespace, "schedule", "policy", "set", "--stagger", "2d"), 2)
    assert "--stagger" in err
    one_line_error(cli(url, namespace, "schedule", "lint", "--horizon", "0"), 2)
