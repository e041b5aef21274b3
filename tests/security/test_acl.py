"""The ACL roles of docs/operations.md against real Redis and Valkey servers: a worker and a
scheduler process and the operator commands each run under their own user and are never
refused (ACL LOG stays empty of them), and the read-only operator cannot change anything."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from duetime.common import scripts

import duetime
from duetime.client.runs import EnqueueRequest
from tests.apps import chaos as chaos_app
from tests.conftest import wait_for
from tests.integration.opkit import Driver, cli
from tests.security.roles import Role, documented, refusals

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.chaos:app"
# the scripts each role calls (docs/operations.md, the role table)
SCRIPTS = {
    "worker": ("claim", "heartbeat", "complete", "fail", "release", "handback", "rate_limited",
               "checkpoint", "continue_run"),
    # the reaper also relays dependency notices between partitions (deps_apply, deps_link,
    # deps_done)
    "scheduler": ("materialize", "reap", "partition_owners", "schedule_quarantine",
                  "deps_apply", "deps_link", "deps_done"),
    "operator": ("enqueue", "cancel", "replay", "resolve", "purge", "schedule_upsert",
                 "schedule_pause", "schedule_delete", "materialize", "wait", "hold",
                 "deps_link", "batch_cancel"),
    # the web console's actions: cancel, replay, resolve, pause/resume, trigger, delete/purge,
    # cancel a batch
    "console-write": ("cancel", "replay", "resolve", "schedule_pause", "materialize", "purge",
                      "batch_cancel"),
}
# doctor tries CONFIG GET (refused: it reads persistence from INFO alone); `runs wait` by the
# read-only operator tries the notify script once (refused: it polls); nothing else may be
ALLOWED_REFUSALS = {("command", "config|get"), ("command", "evalsha", "operator-ro")}


def lua_commands(name: str) -> set[str]:
    return {c.lower() for c in re.findall(r"redis\.call\('([A-Za-z]+)'", scripts.source(name))}


def test_each_role_allows_every_command_of_the_scripts_it_calls() -> None:
    """A command added to a script must be added to the roles that call it."""
    docs = {name: {r[1:] for r in rules if r.startswith("+")} for name, rules in documented().items()}
    for role, names in SCRIPTS.items():
        for name in names:
            missing = lua_commands(name) - docs[role]
            assert not missing, f"{name}.lua uses {missing}, not in the {role} role"
    for ro in ("operator-ro", "console"):
        read_only = docs[ro]
        assert "evalsha" not in read_only and not any(c.startswith(("eval", "fcall")) for c in read_only)
        assert [r for r in documented()[ro] if "~" in r] == ["%R~duetime:*"], ro


def start(role: Role, port: int, namespace: str, journal: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DUETIME_REDIS_URL": role.url(port), "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT), "DUETIME_CHAOS_JOURNAL": str(journal)}
    log = open(journal.parent / f"{role.name}.log", "ab")  # noqa: SIM115 - owned by the process
    return subprocess.Popen([sys.executable, "-m", "duetime", "--log-level", "WARNING", *args],
                            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _other_partitions(app) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Ids of two runs in different partitions."""
    k = app.keys
    a = "acl-dep"
    return a, next(f"acl-dependent{i}" for i in range(1000)
                   if k.partition_of_run(f"acl-dependent{i}") != k.partition_of_run(a))


def wait_until(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    wait_for(pred, timeout, interval=0.1, what=what)  # never under WAIT_FLOOR_S, as every wait


@pytest.mark.slow
def test_each_role_runs_its_part_and_nothing_is_refused(acl, namespace: str, tmp_path: Path) -> None:
    server, rs = acl
    port = server.port
    app = chaos_app.app
    app.configure(redis_url=rs["operator"].url(port), namespace=namespace)
    journal = tmp_path / "journal"
    procs = []
    try:
        # the application side (operator role): schedules and runs of every outcome
        app.schedule("acl-every", duetime.Every(timedelta(seconds=1)), chaos_app.tick,
                     lateness=0.5)
        app.schedule("acl-skip", duetime.Every(timedelta(seconds=1)), chaos_app.long_tick,
                     args=[1.5], overlap="skip")
        ok = [chaos_app.quick.enqueue(0.0) for _ in range(3)] + [chaos_app.aquick.enqueue(0.0)]
        # batches of 16 or more runs to a partition: enqueue, claim and complete write them into
        # skiplists (OBJECT ENCODING first, lua/_lib.lua zadd_batch)
        ok += app.enqueue_many([(chaos_app.quick, [0.0])] * (40 * app.keys.partitions))
        failing = chaos_app.failing.enqueue()
        flaky = chaos_app.flaky.enqueue()
        later = chaos_app.quick.options(delay=3600).enqueue(0.0)
        # a dependency and its dependent in another partition: the producer links them
        # (deps_link, then LREM of its link request), the reaper relays the notice when the
        # dependency ends (deps_apply, deps_done)
        dep, dependent = _other_partitions(app)
        spec = app.registry.resolve(chaos_app.quick)
        app.store.enqueue_many([EnqueueRequest(spec, [0.0], run_id=dep, delay=2)])
        app.store.enqueue_many([EnqueueRequest(spec, [0.0], run_id=dependent, depends_on=(dep,))])
        procs.append(start(rs["scheduler"], port, namespace, journal, "scheduler",
                           "--tick", "100ms", "--reap-tick", "100ms"))
        w1 = start(rs["worker"], port, namespace, journal, "worker", "--app", APP, "--lease", "1s",
                   "--grace", "200ms", "--concurrency", "64")
        procs.append(w1)
        wait_until(lambda: all(app.get_run(i).state == "succeeded" for i in ok + [flaky])
                   and app.get_run(failing).state == "dead", 30, "runs to finish")
        wait_until(lambda: app.get_run(dependent).state == "succeeded", 60,
                   "the dependent released by the relay")
        # a worker that dies mid-run (reaped into uncertain), one stopped gracefully (release),
        # and a cancel request honoured at a heartbeat
        interrupted = chaos_app.nonidem.enqueue(5.0)
        wait_until(lambda: app.get_run(interrupted).state == "running", 20, "the run to start")
        w1.send_signal(signal.SIGKILL)
        w1.wait()
        wait_until(lambda: app.get_run(interrupted).state == "uncertain", 20, "the reap")
        w2 = start(rs["worker"], port, namespace, journal, "worker", "--app", APP, "--lease", "1s",
                   "--grace", "200ms")
        procs.append(w2)
        to_cancel = chaos_app.aquick.enqueue(5.0)  # async: cancelled at once
        wait_until(lambda: app.get_run(to_cancel).state == "running", 20, "the slow run to start")
        url = rs["operator"].url(port)
        assert cli(url, namespace, "runs", "cancel", to_cancel).exit_code == 0
        wait_until(lambda: app.get_run(to_cancel).state == "cancelled", 20, "the cancel")
        released = chaos_app.slow.enqueue(5.0)
        wait_until(lambda: app.get_run(released).state == "running", 20, "the run to start")
        w2.send_signal(signal.SIGTERM)
        assert w2.wait(30) == 0
        assert app.get_run(released).state == "scheduled"  # given back at shutdown
        procs.append(start(rs["worker"], port, namespace, journal, "worker", "--app", APP))
        wait_until(lambda: app.get_run(released).state == "succeeded", 30, "the released run")
        wait_until(lambda: app.get_schedule("acl-every").missed_count + app.get_schedule(
            "acl-every").materialized_count >= 3 and app.get_schedule("acl-skip").skipped_count >= 1,
            20, "the schedules to fire (and skip)")

        # the read-only operator sees everything
        ro = rs["operator-ro"].url(port)
        for args in (["runs", "list"], ["runs", "list", "--state", "dead", "--json"],
                     ["runs", "show", ok[0]], ["runs", "show", failing, "--json"],
                     ["runs", "wait", ok[0], "--timeout", "1s"], ["dead", "list"],
                     ["dead", "show", failing], ["uncertain", "list"], ["schedule", "list"],
                     ["schedule", "show", "acl-every"], ["top", "--once"], ["top", "--once", "--json"],
                     ["workers"], ["leases"], ["keys"], ["keys", "--run", ok[0]], ["doctor"],
                     ["queue", "list"]):
            res = cli(ro, namespace, *args)
            assert res.exit_code == 0, (args, res.stdout[-300:], res.stderr[-500:])

        # the operator repairs
        for args in (["runs", "replay", ok[0], "--force"], ["runs", "cancel", later],
                     ["dead", "replay", failing], ["uncertain", "resolve", interrupted, "--as", "failed"],
                     ["dead", "purge", "--yes"],
                     ["schedule", "add", "acl-new", "--app", APP, "--task", "chaos.tick", "--every", "1h"],
                     ["schedule", "pause", "acl-new"], ["schedule", "resume", "acl-new"],
                     ["schedule", "trigger", "acl-new"],
                     ["schedule", "backfill", "acl-new", "--from", "2026-01-01T00:00:00Z",
                      "--to", "2026-01-01T03:00:00Z"],
                     ["schedule", "delete", "acl-new"], ["enqueue", "chaos.quick", "--app", APP],
                     # a pause the worker's claims see (under its role) until the resume
                     ["queue", "pause", "default", "--note", "acl"], ["queue", "list"],
                     ["queue", "resume", "default"]):
            res = cli(url, namespace, *args)
            assert res.exit_code == 0, (args, res.stdout[-300:], res.stderr[-500:])
        # the scheduler and the last worker serve on after the operators' commands (shown by
        # work they do, not by a pause): a run enqueued now succeeds, the schedule fires again
        fired = app.get_schedule("acl-every").materialized_count
        after = chaos_app.quick.enqueue(0.0)
        wait_until(lambda: app.get_run(after).state == "succeeded", 30, "a run after the repairs")
        wait_until(lambda: app.get_schedule("acl-every").materialized_count > fired, 30,
                   "the schedule to fire after the repairs")
        for p in (procs[0], procs[-1]):  # the scheduler and the last worker
            assert p.poll() is None, "a process stopped"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    admin = redis.Redis(port=port)
    refused = [r for r in refusals(admin, rs)
               if (r["reason"], r["object"]) not in ALLOWED_REFUSALS
               and (r["reason"], r["object"], str(r["username"]).rsplit("-", 1)[0].removeprefix("duetime-"))
               not in ALLOWED_REFUSALS]
    admin.close()
    assert not refused, refused


def snapshot(port: int, namespace: str) -> dict[bytes, bytes]:
    r = redis.Redis(port=port)
    out = {k: r.dump(k) for k in r.scan_iter(f"{namespace}:*", count=1000)}
    r.close()
    return out


def test_the_read_only_operator_cannot_change_state(acl, namespace: str) -> None:
    server, rs = acl
    port = server.port
    app = chaos_app.app
    app.configure(redis_url=server.url, namespace=namespace)  # set up as the default user
    d = Driver(app)
    dead = d.dead(chaos_app.failing, 1)[0]
    done = d.succeeded(chaos_app.quick, 1)[0]
    unsure = d.uncertain(chaos_app.nonidem, 1)[0]
    waiting = chaos_app.quick.options(delay=3600).enqueue(0.0)
    app.schedule("ro-sched", duetime.Every(timedelta(hours=1)), chaos_app.tick)
    before = snapshot(port, namespace)
    ro = rs["operator-ro"].url(port)
    for args in (["runs", "cancel", waiting], ["runs", "replay", done, "--force"],
                 ["dead", "replay", dead], ["dead", "replay", "--all"], ["dead", "purge", "--yes"],
                 ["uncertain", "resolve", unsure, "--as", "succeeded"],
                 ["schedule", "pause", "ro-sched"], ["schedule", "resume", "ro-sched"],
                 ["schedule", "trigger", "ro-sched"], ["schedule", "delete", "ro-sched"],
                 ["schedule", "backfill", "ro-sched", "--from", "2026-01-01T00:00:00Z",
                  "--to", "2026-01-01T03:00:00Z"],
                 ["schedule", "add", "ro-new", "--app", APP, "--task", "chaos.tick", "--every", "1h"],
                 ["enqueue", "chaos.quick", "--app", APP]):
        res = cli(ro, namespace, *args)
        assert res.exit_code == 1, (args, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()  # `dead replay --all` names its progress first
        errors = [ln for ln in lines if ln.startswith("error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in res.stderr, lines
        err = errors[0]
        assert "NOPERM" in err or "permission" in err, (args, err)
        assert "docs/operations.md" in err or "NOPERM" in err, (args, err)
    assert snapshot(port, namespace) == before


def test_the_read_only_operator_waits_for_a_run_by_polling(acl, namespace: str) -> None:
    """No script runs under the read-only role, so `wait` cannot register on the run's notice:
    it polls, and returns the result once a worker (here: the admin's scripts) finishes it."""
    import threading

    server, rs = acl
    admin_app = duetime.App(redis_url=server.url, namespace=namespace)
    add = admin_app.task(name="acl.add")(lambda a, b: a + b)
    run_id = add.enqueue(2, 3)
    reader = duetime.App(redis_url=rs["operator-ro"].url(server.port), namespace=namespace)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(reader.wait(run_id, timeout=10)))
    waiter.start()
    admin = redis.Redis.from_url(server.url)
    # the waiter is under way (the read-only user is connected) before the run is finished
    ro = rs["operator-ro"].user
    wait_for(lambda: any(c.get("user") == ro for c in admin.client_list()), 10,
             what="the read-only waiter to connect")
    admin.close()
    assert waiter.is_alive() and not got  # still waiting: the run has not run
    d = Driver(admin_app)
    from duetime.common import transitions as tr
    from duetime.common.codec import pack_result

    for p, c in d.claim_all():
        keys, args = tr.complete(d.k, p, [(c.run_id, c.fence, pack_result(5))])
        assert d.scripts.complete(keys=keys, args=args) == [b"succeeded"]
    waiter.join(5)
    assert got == [5]
    reader.close()
    admin_app.close()
