"""Bad input: a clear error, and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from duetime.common.errors import InvalidInput, PayloadTooLarge, RedisUnavailable, UnknownTask

from duetime import App
from duetime.embedded import free_port
from tests import schedrec
from tests.apps import basic
from tests.conftest import ROOT, wait_for


def ns_keys(r, app) -> list[bytes]:
    """The namespace's keys but what its first use writes (`<ns>:meta`, each partition's
    `T:caps` with the layout format): what an enqueue wrote."""
    return [k for k in r.scan_iter(f"{app.keys.namespace}:*")
            if not k.endswith((b":meta", b":caps"))]


def test_oversized_payload_is_refused_and_writes_nothing(app, r):
    with pytest.raises(PayloadTooLarge, match="over the 524288-byte cap"):
        app.enqueue(basic.noop, ["x" * (600 * 1024)])
    # enqueue_many validates everything before writing anything
    with pytest.raises(PayloadTooLarge):
        app.enqueue_many([(basic.noop, [1]), (basic.noop, ["x" * (600 * 1024)])])
    assert ns_keys(r, app) == []
    # also when the bad one comes after several round trips' worth of good ones
    with pytest.raises(PayloadTooLarge):
        app.enqueue_many([(basic.noop, [i]) for i in range(5000)]
                         + [(basic.noop, ["x" * (600 * 1024)])])
    assert ns_keys(r, app) == []


def test_payload_cap_is_configurable(url, namespace):
    small = App(redis_url=url, namespace=namespace, max_payload=100)
    small.registry.add(basic.noop.duetime_task)
    with pytest.raises(PayloadTooLarge, match="100-byte cap"):
        small.enqueue("noop", ["y" * 200])
    small.close()


def test_unserialisable_payload(app, r):
    with pytest.raises(InvalidInput, match="not msgpack-serialisable"):
        app.enqueue(basic.noop, [object()])
    assert ns_keys(r, app) == []


@pytest.mark.parametrize("bad", ["a{b", "a}b", "tab\there", "nl\nx", "bell\x07", "", "x" * 201])
def test_bad_names_are_refused(app, r, bad):
    with pytest.raises(InvalidInput):
        app.enqueue(basic.noop, queue=bad)
    with pytest.raises(InvalidInput):
        app.enqueue(basic.noop, key=bad)
    with pytest.raises(InvalidInput):
        app.task(name=bad)(lambda: None)
    assert ns_keys(r, app) == []


def test_unknown_task_at_enqueue(app, r):
    with pytest.raises(UnknownTask, match="unknown task 'nope'"):
        app.enqueue("nope")
    assert ns_keys(r, app) == []


def test_idempotency_key_gives_one_run(app, r):
    a = app.enqueue(basic.noop, [1], key="invoice-7")
    b = app.enqueue(basic.noop, [2], key="invoice-7")
    assert a == b
    assert app.get_run(a).args == [1]
    p = app.keys.partition_of_run(a)
    assert r.zcard(app.keys.due(p, "default")) == 1
    # the same key for another task is another run
    assert app.enqueue(basic.anoop, key="invoice-7") != a
    # and within one bulk call too
    ids = app.enqueue_many([{"task": basic.noop, "key": "bulk-1"}] * 3)
    assert len(set(ids)) == 1


def test_redis_down_at_enqueue_is_a_clear_error():
    port = free_port()
    app = App(redis_url=f"redis://:s3cret@127.0.0.1:{port}/0")
    app.registry.add(basic.noop.duetime_task)
    with pytest.raises(RedisUnavailable) as err:
        app.enqueue("noop")
    assert f"127.0.0.1:{port}" in str(err.value) and "s3cret" not in str(err.value)


def test_partition_mismatch_is_refused(url, namespace):
    App(redis_url=url, namespace=namespace, partitions=16).store.ready()
    from duetime.common.errors import PartitionMismatch

    with pytest.raises(PartitionMismatch, match="created with 16 partitions"):
        App(redis_url=url, namespace=namespace, partitions=8).store.ready()


def test_worker_bad_app_reference_is_a_usage_error():
    p = subprocess.run([sys.executable, "-m", "duetime", "worker", "--app", "no_such_module:app"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "cannot import 'no_such_module'" in p.stderr
    assert "Traceback" not in p.stderr


def test_enqueue_many_refuses_internal_fields(app):
    """A dict item holds enqueue's own arguments only: no run id (could hold a newline), no
    `extra` (could overwrite `state`)."""
    for bad in ({"task": basic.noop, "run_id": "x\ny"}, {"task": basic.noop, "extra": {"state": "dead"}},
                {"args": [1]}):
        with pytest.raises(InvalidInput):
            app.enqueue_many([{"task": basic.noop}, bad])
    assert app.enqueue_many([{"task": basic.noop, "args": [1], "key": "k1", "delay": 5}])


def _duetime(*args: str, cwd: object = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "duetime", "--log-level", "INFO", *args],
                          capture_output=True, text=True, errors="replace", timeout=60,
                          cwd=cwd or ROOT, env=env)


def test_operator_tools_show_the_rest_when_one_record_is_damaged(app, url, namespace):
    """A run record with unreadable numbers and non-UTF-8 text, one with a payload that is not
    msgpack, a schedule with an unknown trigger kind: every listing still works."""
    import duetime

    ids = [app.enqueue(basic.noop, [i]) for i in range(3)]
    k, r = app.keys, app.store.client
    p = k.partition_of_run(ids[0])
    r.hset(k.run(p, ids[0]), mapping={"attempt": "abc", "max_attempts": "inf", "due": "xyz",
                                      "task": b"\xff\xfe"})
    r.hset(k.run(k.partition_of_run(ids[1]), ids[1]), "payload", b"\xc1\xc1")
    app.schedule("damaged", duetime.Every(60), basic.noop)
    schedrec.edit(r, k, "damaged", **{"t.kind": "weekly", "max_catchup": "lots"})
    for cmd in (["runs", "list"], ["runs", "list", "--json"], ["runs", "show", ids[0]],
                ["runs", "show", ids[1], "--json"], ["schedule", "list"], ["top", "--once"],
                ["keys"]):
        out = _duetime("--redis-url", url, "--namespace", namespace, *cmd)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (cmd, out.stderr[-2000:])
    listing = _duetime("--redis-url", url, "--namespace", namespace, "runs", "list").stdout
    assert all(i in listing for i in ids)  # the damaged ones are listed with the others
    assert "damaged" in _duetime("--redis-url", url, "--namespace", namespace, "schedule",
                                 "list").stdout


def test_the_scheduler_gauges_survive_a_damaged_finished_run(app, url):
    """Found by the damaged-records property test: a finished run whose `started` or `queue`
    was overwritten with junk killed the gauges loop (and with it the scheduler) when the
    console's activity sample read it. The sample skips what it cannot read."""
    from duetime.scheduler.gauges import Gauges

    from duetime.ops.inspect import Inspector
    from tests.integration.opkit import Driver

    ids = Driver(app).succeeded(basic.noop, 3)
    k, r = app.keys, app.store.client
    r.hset(k.run(k.partition_of_run(ids[0]), ids[0]), mapping={"started": b"\xff\xfe"})
    r.hset(k.run(k.partition_of_run(ids[1]), ids[1]), mapping={"queue": b"\xff\xfe"})
    ov = Inspector(r, k, url).overview(activity=True, window_s=60)
    assert ov.queues["default"].finished_per_s > 0
    g = Gauges(url, k, interval_s=1.0)
    g.update()  # raised ValueError before
    g.client.close()


def test_bad_apps_urls_and_arguments_are_one_error_line(tmp_path):
    (tmp_path / "boomapp.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "synapp.py").write_text("def x(:\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases = [
        (["worker", "--app", "boomapp:app"], "boom at import"),
        (["worker", "--app", "synapp:app"], "SyntaxError"),
        (["--redis-url", "notaurl", "runs", "list"], "not a Redis URL"),
        (["--redis-url", f"redis+cluster://127.0.0.1:{free_port()}", "runs", "list"],
         "cannot reach Redis"),
        (["--redis-url", "redis://127.0.0.1:1/0", "enqueue", "noop", "--args",
          "[" * 3000 + "]" * 3000], "nested too deeply"),
        (["--redis-url", "redis://127.0.0.1:1/0", "runs", "show", "\udcff"], "not valid UTF-8"),
    ]
    for args, words in cases:
        out = _duetime(*args, cwd=tmp_path, env=env)
        lines = out.stderr.strip().splitlines()
        assert out.returncode in (1, 2) and "Traceback" not in out.stderr, (args, out.stderr)
        assert lines[-1].startswith("error:") and words in lines[-1], (args, lines)


def test_a_password_in_the_url_query_is_never_printed(url, namespace):
    """`?password=` is redacted like `user:pass@` in doctor, top, keys and the connected log."""
    from duetime.common.connection import redact

    secret = "hunter2-query-secret"
    assert secret not in redact(f"redis://127.0.0.1:1/0?password={secret}&db=0")
    assert "password=***" in redact(f"redis://127.0.0.1:1/0?password={secret}")
    port = url.rsplit(":", 1)[1].split("/")[0]
    bad = f"redis://127.0.0.1:{port}/0?password={secret}"
    for cmd in (["doctor"], ["top", "--once"], ["keys"], ["reaper", "--tick", "100ms"]):
        if cmd[0] == "reaper":  # a long-running process: its 'connected' line, then stop it
            p = subprocess.Popen([sys.executable, "-m", "duetime", "--redis-url", bad, "--namespace",
                                  namespace, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 cwd=ROOT)
            err = bytearray()

            def read(stream=p.stderr, into=err):
                while chunk := stream.read1(4096):
                    into.extend(chunk)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            # until it said where it connected (stopped after a fixed 3 s, a reaper a loaded
            # machine started late had printed nothing, and the check below proved nothing)
            wait_for(lambda err=err, p=p: b"connected" in err or p.poll() is not None, 60,
                     what="the reaper's 'connected' line")
            p.terminate()
            p.wait(60)
            reader.join(30)
            assert b"password=***" in err, err.decode(errors="replace")[-1500:]
            text = p.stdout.read().decode(errors="replace") + err.decode(errors="replace")
        else:
            out = _duetime("--redis-url", bad, "--namespace", namespace, *cmd)
            text = out.stdout + out.stderr
        assert secret not in text, (cmd, text[-1500:])
