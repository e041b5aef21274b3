"""common.outage: back-off bounds, and one log line per incident (plus its end)."""

from __future__ import annotations

import random

from duetime.common.outage import Outage, bounded

from tests.recorder import Recorder


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(**kw) -> tuple[Outage, Recorder, Clock]:
    log, clock = Recorder(), Clock()
    return Outage("test loop", log, clock=clock, rand=random.Random(7).random, **kw), log, clock


def test_backoff_doubles_with_jitter_up_to_the_cap():
    o, _, _ = make(base_s=0.1, cap_s=2.0)
    waits = [o.failed(ConnectionError("refused")) for _ in range(12)]
    fulls = [min(2.0, 0.1 * 2 ** i) for i in range(12)]
    assert all(f / 2 <= w <= f for w, f in zip(waits, fulls, strict=True)), waits
    assert len(set(waits)) == len(waits)  # jittered, not in step with other processes
    assert max(waits) <= 2.0
    o.ok()
    assert o.delay() == 0.0 and 0.05 <= o.failed(ConnectionError("x")) <= 0.1  # starts over


def test_an_incident_is_logged_when_it_starts_and_ends_with_its_count():
    o, log, clock = make(remind_s=60.0)
    for _ in range(500):
        o.failed(ConnectionError("Error 111 connecting"))
        clock.t += 0.01
    assert [e for _, e, _ in log.lines] == ["redis unavailable; backing off"]
    assert log.lines[0][2]["error"] == "ConnectionError: Error 111 connecting"
    o.ok()
    o.ok()  # no incident: nothing more
    [(level, event, kw)] = log.lines[1:]
    assert (level, event) == ("info", "redis available again")
    assert kw["failures"] == 500 and kw["outage_s"] == 5.0 and kw["loop"] == "test loop"


def test_a_long_incident_is_recalled_once_a_minute():
    o, log, clock = make(remind_s=60.0)
    for _ in range(300):  # 150 s of failures, one every half second
        o.failed(OSError("down"))
        clock.t += 0.5
    events = [e for _, e, _ in log.lines]
    assert events == ["redis unavailable; backing off"] + ["redis still unavailable"] * 2


def test_stale_connections_right_after_a_recovery_are_not_a_new_incident():
    o, log, clock = make(settle_s=5.0)
    o.failed(ConnectionError("refused"))
    clock.t += 3
    o.ok()
    clock.t += 0.001
    o.failed(ConnectionError("Connection closed by server."))  # a pooled connection from before
    o.ok()
    assert [e for _, e, _ in log.lines] == ["redis unavailable; backing off", "redis available again"]
    # failures that go on past the settling time are a new incident, announced then
    clock.t += 1
    o.failed(ConnectionError("refused"))
    clock.t += 6
    o.failed(ConnectionError("refused"))
    clock.t += 1
    o.ok()
    assert [e for _, e, _ in log.lines][2:] == ["redis unavailable; backing off",
                                                "redis available again"]


def test_bounded_error_text():
    assert bounded(ConnectionError("a\nb")) == "ConnectionError: a"
    assert bounded(TimeoutError()) == "TimeoutError"
    assert len(bounded(OSError("x" * 1000))) == len("OSError: ") + 200
