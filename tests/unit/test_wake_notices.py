"""Wake notices '<partition>|<queue>|<due ms>' are read defensively, and no name may hold a
separator of duetime's messages or lists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from duetime.common.errors import InvalidInput
from duetime.common.names import check_name
from duetime.common.wake import parse_scheduler_notice, parse_worker_wake, scheduler_notice, worker_wake
from duetime.worker.errors import log_message


def test_a_good_notice():
    assert parse_worker_wake(b"3|mail|1700000000123", 16) == (3, "mail", 1700000000123.0)
    assert parse_worker_wake("0|default|5.5", 16) == (0, "default", 5.5)


@pytest.mark.parametrize("data", [
    b"", b"hello", b"1|default", b"1|a|b|c", b"x|default|5", b"1|default|soon",
    b"16|default|5", b"-1|default|5", b"1||5", b"1|default|nan", b"1|default|inf",
    b"\xff\xfe|default|1", 12, None, [b"1", b"default", b"5"],
])
def test_anything_else_is_not_a_notice(data):
    assert parse_worker_wake(data, 16) is None


def test_what_is_built_parses_back():
    assert worker_wake(3, "mail", 1700000000123) == "3|mail|1700000000123"
    assert parse_worker_wake(worker_wake(3, "mail", 1700000000123).encode(), 16) == (
        3, "mail", 1700000000123.0)
    assert scheduler_notice("l", 7, 42) == "l|7|42"
    assert parse_scheduler_notice(scheduler_notice("l", 7, 42).encode()) == ("l", 7, 42)


@pytest.mark.parametrize("data", [b"", b"s|1", b"s|x|5", b"s|1|soon", b"s|1|inf", b"s|1|nan",
                                  b"\xff|1|5", b"s|1|5|6"])
def test_anything_else_is_not_a_scheduler_notice(data):
    assert parse_scheduler_notice(data) is None


@pytest.mark.parametrize("kind", ["queue", "task name", "schedule name", "idempotency key",
                                  "run id", "namespace"])
def test_the_notice_separator_is_refused_in_every_name(kind):
    with pytest.raises(InvalidInput, match="separator"):
        check_name(kind, "a|b")


def test_the_list_separator_is_refused_in_queue_names_only():
    with pytest.raises(InvalidInput, match="separator"):
        check_name("queue", "mail,sms")
    assert check_name("idempotency key", "order,42") == "order,42"


def test_enqueue_task_and_schedule_refuse_a_separator_in_a_queue_name():
    from duetime.common.schedules import ScheduleDef

    import duetime

    app = duetime.App()
    with pytest.raises(InvalidInput):
        app.task(name="t", queue="a|b")(lambda: None)
    with pytest.raises(InvalidInput):
        ScheduleDef(name="s", trigger=duetime.Every(timedelta(minutes=1)), task="t", queue="a|b", payload=b"")


def test_log_message_is_bounded_or_withheld():
    assert log_message("KeyError: 'x'\nTraceback...", True) == "KeyError: 'x'"
    assert len(log_message("E: " + "x" * 1000, True)) == 200
    assert log_message("KeyError: 'secret'", False) is None


@pytest.mark.parametrize("data", [b"l|0|inf", b"l|0|-inf", b"s|1|nan", b"d|x|5", b"l|0|1e400",
                                  b"junk"])
def test_a_scheduler_notice_that_is_no_time_is_ignored(data):
    """A stray PUBLISH on the scheduler wake channel (`inf` overflowed int() and killed the
    listener thread: no notices after it) changes nothing."""
    import threading

    from duetime.scheduler.notices import Heads, Listener

    heads = Heads()
    listener = Listener(None, "redis://x", "ch", "lsd", heads, threading.Event())
    listener._handle(data)
    assert heads.earliest() is None
    listener._handle(b"l|0|1700000000123")
    assert heads.earliest() == 1700000000123


def test_a_notice_newer_than_a_read_still_counts():
    from duetime.common.wake import with_notice

    assert with_notice(500, None, 3) == 500  # no notice: the read
    assert with_notice(500, (2, 100), 3) == 500  # a notice older than the read: the read
    assert with_notice(500, (4, 100), 3) == 100  # newer and earlier: the notice
    assert with_notice(500, (4, 900), 3) == 500  # newer but later: the read
    assert with_notice(None, (4, 900), 3) == 900  # the read found the set empty
