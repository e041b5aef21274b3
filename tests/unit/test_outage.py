"""common.outage: back-off bounds, and one log line per incident (plus its end)."""

from __future__ import annotations

import random

from duetime.common import outage
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


def test_an_incident_says_whether_redis_is_unreachable_moving_or_refusing():
    import redis

    cases = [(redis.ConnectionError("Error 111"), "warning", "redis unavailable; backing off"),
             (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), "warning",
              "redis cluster is failing over or moving slots; backing off"),
             (redis.exceptions.OutOfMemoryError("OOM command not allowed"), "error",
              "redis refused a call; backing off")]
    for exc, level, event in cases:
        o, log, _ = make()
        o.failed(exc)
        [(got_level, got_event, kw)] = log.lines
        assert (got_level, got_event) == (level, event)
        assert ("advice" in kw) == (level == "error")  # a refusal says what to do about it
        assert outage.kind(exc) in outage.ANNOUNCE


def test_a_cap_that_follows_the_error():
    """cap_s None (the scheduler's loops): a failover backs off to a second at most, a refusal
    that a quick retry will not cure to five."""
    import redis

    o, _, _ = make(cap_s=None)
    moving = [o.failed(redis.exceptions.ClusterDownError("CLUSTERDOWN")) for _ in range(20)]
    assert max(moving) <= outage.TOPOLOGY_CAP_S and max(moving) > outage.TOPOLOGY_CAP_S / 2
    o.ok()
    refused = [o.failed(redis.exceptions.OutOfMemoryError("OOM")) for _ in range(20)]
    assert max(refused) <= outage.REFUSED_CAP_S and max(refused) > outage.TOPOLOGY_CAP_S


def test_a_scheduler_loop_backs_off_says_why_it_is_not_ready_and_rereads_the_topology():
    import redis
    from duetime.common import metrics
    from duetime.scheduler.notices import backed_off

    class Nodes:
        reads = 0

        def initialize(self) -> None:
            Nodes.reads += 1

    class Cluster:
        nodes_manager = Nodes()

    o, log, _ = make(cap_s=None)
    url = "redis://user:secret@127.0.0.1:1/0"
    try:
        wait = backed_off("test-loop", o, redis.ConnectionError("Error 111"), url, Cluster())
        assert 0 < wait <= outage.TOPOLOGY_CAP_S and Nodes.reads == 1
        check = metrics.health.readiness().checks["test-loop"]
        assert check["ok"] is False and "cannot reach Redis" in str(check["reason"])
        assert "secret" not in str(check["reason"])
        backed_off("test-loop", o, redis.exceptions.ResponseError("WRONGTYPE x"), url, Cluster())
        assert Nodes.reads == 1  # a refusal is not a topology change
        assert metrics.health.readiness().checks["test-loop"]["reason"] == (
            "redis refused a call: ResponseError: WRONGTYPE x")
        assert [e for _, e, _ in log.lines] == ["redis unavailable; backing off"]  # one incident
    finally:
        metrics.health.forget("test-loop")
