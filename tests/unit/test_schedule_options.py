"""`App.schedule` and `App.schedule_def` take one list of options (`ScheduleOptions`): every
keyword users pass today, an unknown one refused by name."""

from __future__ import annotations

from datetime import timedelta

import pytest

import duetime
from duetime.app import ScheduleOptions

# the public keywords of app.schedule, besides name, trigger, task, args and kwargs
PUBLIC = {"queue", "catchup", "max_catchup", "lateness", "overlap", "jitter", "owner", "paused",
          "miss_tolerance", "stagger", "tenant", "calendar", "on_excluded",
          # guardrails
          "pause_after_failures", "start", "end", "max_runs"}


@pytest.fixture
def app():
    a = duetime.App()

    @a.task(name="t", queue="work", owner="team")
    def t(x: int = 0) -> None: ...

    return a


def test_every_keyword_of_schedule_is_an_option():
    assert ScheduleOptions.__optional_keys__ | {"paused"} == PUBLIC


def test_the_options_reach_the_definition(app):
    every = duetime.Every(timedelta(minutes=1))
    d = app.schedule_def("s", every, "t", [4], queue="q", catchup="all", max_catchup=7,
                         lateness="5m", overlap="skip", jitter=3, owner="me",
                         miss_tolerance=timedelta(seconds=90), stagger="10s", tenant="acme")
    assert (d.queue, d.catchup, d.max_catchup, d.lateness_ms, d.overlap, d.jitter_ms, d.owner,
            d.miss_tolerance_ms, d.stagger_ms, d.tenant) == (
        "q", "all", 7, 300_000, "skip", 3000, "me", 90_000, 10_000, "acme")
    plain = app.schedule_def("s", every, "t")  # the defaults: the task's, ScheduleDef's
    assert (plain.queue, plain.owner, plain.catchup, plain.max_catchup, plain.overlap,
            plain.lateness_ms, plain.stagger_ms) == ("work", "team", "latest", 100, "allow", 0, None)


def test_an_unknown_option_is_refused_by_name(app):
    every = duetime.Every(timedelta(minutes=1))
    with pytest.raises(TypeError, match="catchupp"):
        app.schedule_def("s", every, "t", catchupp="all")
    with pytest.raises(TypeError, match="paused"):  # paused belongs to schedule, not the def
        app.schedule_def("s", every, "t", paused=True)
    with pytest.raises(TypeError, match="lateness_ms"):  # refused before Redis is asked
        app.schedule("s", every, "t", lateness_ms=5)
