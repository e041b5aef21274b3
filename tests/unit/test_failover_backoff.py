"""A partition whose node fails over is retried on a short back-off, not left for seconds."""

from __future__ import annotations

import time

import pytest
import redis
from duetime.common.connection import topology_error
from duetime.common.keys import Keyspace
from duetime.common.outage import REFUSED_CAP_S, TOPOLOGY_CAP_S, jittered, retry_in
from duetime.worker.due import DueTimes

MOVING = [
    redis.ConnectionError("Connection refused"),
    redis.TimeoutError("timed out"),
    redis.exceptions.ClusterDownError("The cluster is down"),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.MasterDownError("Link with MASTER is down"),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
    redis.exceptions.NoScriptError("No matching script"),
    redis.ResponseError("CLUSTERDOWN The cluster is down"),
]
REFUSED = [
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
    redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    redis.ResponseError("ERR user_script:1: something broke"),
]


@pytest.mark.parametrize("exc", MOVING, ids=lambda e: type(e).__name__)
def test_failover_errors_are_topology_errors(exc):
    assert topology_error(exc)
    assert all(retry_in(exc, n) <= TOPOLOGY_CAP_S for n in range(1, 40))


@pytest.mark.parametrize("exc", REFUSED, ids=lambda e: str(e)[:12])
def test_refusals_back_off_longer(exc):
    assert not topology_error(exc)
    assert max(retry_in(exc, n) for n in range(1, 40)) > TOPOLOGY_CAP_S


def test_jitter_stays_in_the_upper_half_and_doubles():
    assert jittered(1, 1.0, rand=lambda: 0.0) == pytest.approx(0.05)
    assert jittered(1, 1.0, rand=lambda: 1.0) == pytest.approx(0.1)
    assert jittered(3, 1.0, rand=lambda: 1.0) == pytest.approx(0.4)
    assert jittered(30, 1.0, rand=lambda: 1.0) == pytest.approx(1.0)
    assert jittered(30, REFUSED_CAP_S, rand=lambda: 0.0) == pytest.approx(REFUSED_CAP_S / 2)


def _held_for(due: DueTimes, key) -> float:
    return due._held[key] - time.monotonic()


def test_a_partition_on_a_failing_over_node_is_held_a_second_at_most():
    """The old behaviour held it 5 s whatever the error: work on a dead primary's partitions
    resumed seconds after its replica had been promoted."""
    due = DueTimes(Keyspace("t", 4), ["default"], "w", on_earlier=lambda: None)
    key = (1, "default")
    due.note(key, 0.0)
    for _ in range(20):
        assert due.refuse(key, "claiming", redis.exceptions.ClusterDownError("The cluster is down"))
        assert _held_for(due, key) <= TOPOLOGY_CAP_S + 0.01
    assert due.due_now(10.0) == []  # held for now
    due.ok(key)
    assert not due.refuse(key, "claiming", redis.ResponseError("WRONGTYPE damaged"))
    assert _held_for(due, key) <= 0.11  # the back-off starts again from the bottom
    for _ in range(10):
        due.refuse(key, "claiming", redis.ResponseError("WRONGTYPE damaged"))
    assert _held_for(due, key) > TOPOLOGY_CAP_S  # a damaged key is not retried every second


def test_an_unreadable_head_is_probed_by_a_claim_not_forgotten():
    due = DueTimes(Keyspace("t", 4), ["default"], "w", on_earlier=lambda: None)
    due.next_due[(2, "default")] = 123.0
    due.refuse((2, "default"), "reading due times", redis.ConnectionError("refused"))
    assert due.next_due[(2, "default")] == 123.0


def _raised_in(filename: str) -> AttributeError:
    """The AttributeError a line of `filename` raises, as redis-py's asyncio cluster client
    raises it when another task closed the connection it writes on ("'NoneType' object has no
    attribute 'writelines'")."""
    scope: dict[str, object] = {}
    exec(compile("def send(writer):\n    writer.writelines([b'PING'])\n", filename, "exec"), scope)
    try:
        scope["send"](None)  # type: ignore[operator]
    except AttributeError as exc:
        return exc
    raise AssertionError("no AttributeError")


def test_redis_pys_own_race_on_a_closed_connection_is_retried_as_a_lost_connection():
    from duetime.common.connection import client_glitch
    from duetime.common.outage import kind

    ours, theirs = _raised_in(__file__), _raised_in(redis.asyncio.connection.__file__)
    assert client_glitch(theirs) and topology_error(theirs) and kind(theirs) == "unavailable"
    # the same error raised by duetime's (or the user's) own code is a bug, and says so
    assert not client_glitch(ours) and not topology_error(ours) and kind(ours) == "refused"
    assert not client_glitch(redis.ResponseError("WRONGTYPE"))
