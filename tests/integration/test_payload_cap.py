"""The namespace-wide payload cap (`duetime limits payload`), checked by enqueue.lua itself on
Redis and Valkey: a client with a larger max_payload of its own, or one calling the script
directly, is refused with an error naming the cap, and nothing of the call is written."""

from __future__ import annotations

import pytest
import redis
from duetime.common import transitions as tr
from duetime.common.codec import pack_payload
from duetime.common.errors import InvalidInput, RedisRefused
from duetime.common.scripts import Scripts

import duetime
from duetime.client.caps import FIELD, parse_size, read_payload_cap, set_payload_cap
from duetime.client.runs import task_fields
from tests.integration.opkit import cli


def keys_of(r: redis.Redis, namespace: str) -> dict[bytes, bytes]:
    return {k: r.dump(k) for k in r.scan_iter(f"{namespace}:*", count=1000)}


def test_an_oversized_payload_is_refused_by_the_script_and_nothing_is_written(app, r, namespace):
    big = duetime.App(redis_url=app.redis_url, namespace=namespace, max_payload=4 * 1024 * 1024)
    noop = big.task(name="cap.noop")(lambda text="": None)
    try:
        assert noop.enqueue("x" * 5000)  # no cap yet: the client's own 4 MiB rules
        set_payload_cap(big.store.ready(), big.keys, big.redis_url, 1024)
        assert read_payload_cap(r, big.keys, big.redis_url) == 1024
        assert r.hget(big.keys.meta, FIELD) == b"1024"
        assert all(r.hget(big.keys.caps(p), FIELD) == b"1024" for p in range(big.keys.partitions))
        before = keys_of(r, namespace)
        with pytest.raises(RedisRefused) as err:
            noop.enqueue("x" * 2000)
        assert err.value.code == "PAYLOAD_TOO_LARGE"
        msg = str(err.value)
        assert "namespace cap of 1024 bytes" in msg and "max_payload" in msg, msg
        assert "duetime limits payload" in msg  # the advice: where the cap is set
        assert keys_of(r, namespace) == before
        # one call of the script: a small run then an oversized one, same partition and queue
        k, scripts = big.keys, Scripts(r)
        small = pack_payload(["ok"], {})
        large = pack_payload(["y" * 1500], {})
        p = k.partition_of_run("a" * 20)
        keys, args = tr.enqueue(k, p, "default", task_fields(noop.spec, "default"),
                                [("a" * 20, "", 0, ["payload", small]),
                                 ("b" * 20, "", 0, ["payload", large])])
        with pytest.raises(redis.ResponseError, match="PAYLOAD_TOO_LARGE run b{20}: payload of "):
            scripts.enqueue(keys=keys, args=args)
        assert keys_of(r, namespace) == before  # not even the small run
        # at the cap is allowed; the cap cleared, the large payload goes in again
        n = 1024 - (len(pack_payload(["z" * 1000], {})) - 1000)  # msgpack's framing
        at_cap = noop.enqueue("z" * n)
        assert len(r.hget(k.run(k.partition_of_run(at_cap), at_cap), "payload")) == 1024
        set_payload_cap(r, k, big.redis_url, None)
        assert read_payload_cap(r, k, big.redis_url) is None and r.hget(k.caps(0), FIELD) is None
        assert noop.enqueue("x" * 2000)
    finally:
        big.close()


def test_the_cli_sets_shows_and_clears_the_cap(app, r, namespace):
    url = app.redis_url
    res = cli(url, namespace, "limits", "payload")
    assert res.exit_code == 0 and "max_payload: none" in res.stdout
    res = cli(url, namespace, "limits", "payload", "64KiB")
    assert res.exit_code == 0 and "65536 bytes" in res.stdout, res.stderr
    assert r.hget(app.keys.caps(3), FIELD) == b"65536"
    assert "65536 bytes" in cli(url, namespace, "limits", "payload").stdout
    for bad in ("lots", "0", "1GiB", "-5"):
        res = cli(url, namespace, "limits", "payload", bad)
        assert res.exit_code == 2 and res.stderr.startswith("error: "), (bad, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    assert r.hget(app.keys.meta, FIELD) == b"65536"  # a refused value changed nothing
    assert cli(url, namespace, "limits", "payload", "none").exit_code == 0
    assert r.hget(app.keys.meta, FIELD) is None


def test_sizes_parse_with_units():
    assert parse_size("4096") == 4096 and parse_size("64KiB") == 65536
    assert parse_size("1 MB") == 1_000_000 and parse_size("2mib") == 2 * 1024 * 1024
    for bad in ("", "1.5MB", "12 parsecs", "0"):
        with pytest.raises(InvalidInput):
            parse_size(bad)


def test_a_schedule_over_the_cap_is_quarantined_and_creates_no_run(app, r, url):
    """The cap holds for the runs schedules create too (materialize.lua): the schedule over
    it is set aside with the reason, the others go on; backfill and trigger-now refuse."""
    from datetime import timedelta

    from duetime.scheduler.evaluator import Evaluator

    from tests.integration.test_schedules import runs_of

    noop = app.task(name="cap.snoop")(lambda text="": None)
    app.schedule("cap-big", duetime.Every(timedelta(seconds=1)), noop, args=["x" * 2000])
    app.schedule("cap-small", duetime.Every(timedelta(seconds=1)), noop, args=["ok"])
    set_payload_cap(app.store.ready(), app.keys, app.redis_url, 1024)
    ev = Evaluator(url, app.keys, lead_ms=1500)
    try:
        ev.tick()
        big = app.get_schedule("cap-big")
        assert big.quarantined and "PAYLOAD_TOO_LARGE schedule cap-big" in big.quarantined
        assert "namespace cap of 1024 bytes" in big.quarantined, big.quarantined
        assert runs_of(app, "cap-big") == []
        assert runs_of(app, "cap-small")  # the other schedule goes on
        with pytest.raises(RedisRefused) as err:
            app.trigger("cap-big")
        assert err.value.code == "PAYLOAD_TOO_LARGE"
        assert runs_of(app, "cap-big") == []
    finally:
        ev.client.close()
        set_payload_cap(r, app.keys, app.redis_url, None)
