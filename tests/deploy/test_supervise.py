"""`duetime worker --processes N` keeps N workers: a killed child is replaced, its runs come
back through lease expiry, a crash loop backs off and gives up, bad options stop at once."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from duetime import supervise
from duetime.embedded import bindable, free_port
from duetime.supervise import Supervisor, child_argv, describe
from tests.apps import basic
from tests.conftest import wait_for
from tests.recorder import Recorder

pytestmark = pytest.mark.slow


def children(ppid: int) -> set[int]:
    """Live child processes of `ppid`, read from /proc (no psutil)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, parent = stat[stat.rindex(")") + 2:].split()[:2]
        if int(parent) == ppid and state != "Z":
            out.add(int(entry.name))
    return out


def metrics_port_of(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--metrics-port") + 1])


def serves_metrics(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return resp.status == 200 and b"duetime_runs_claimed_total" in resp.read()
    except OSError:
        return False


def log_events(stderr: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


def test_child_argv_drops_processes_and_gives_each_child_its_own_metrics_port():
    argvs = child_argv(["--log-level", "INFO", "worker", "--app", "a:b", "--processes", "3",
                        "--metrics-port=9400", "--metrics-host", "0.0.0.0"], 3, 9400)
    assert [a[3:] for a in argvs] == [
        ["--log-level", "INFO", "worker", "--app", "a:b", "--metrics-host", "0.0.0.0",
         "--metrics-port", str(9400 + i)] for i in range(3)]
    assert all(a[:3] == [sys.executable, "-m", "duetime"] for a in argvs)
    plain = [sys.executable, "-m", "duetime", "worker"]
    assert child_argv(["worker", "--processes=2"], 2, None) == [plain, plain]


def test_describe_names_signals():
    assert describe(-signal.SIGKILL) == "SIGKILL"
    assert describe(1) == "exit 1"


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_that_keeps_dying_at_start_is_restarted_with_back_off_then_given_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    starts = tmp_path / "starts"
    argv = _py(f"import time; open({str(starts)!r}, 'a').write(f'{{time.monotonic()}}\\n'); "
               "raise SystemExit(1)")
    rec = Recorder()
    monkeypatch.setattr(supervise, "log", rec)
    sup = Supervisor([argv], restart_min_s=0.1, restart_max_s=0.4, stable_s=30, give_up_after=5)
    assert sup.run(poll_s=0.02) == 1
    times = [float(x) for x in starts.read_text().split()]
    assert len(times) == 5 and sup.restarts == 4  # started five times, then given up
    # back-off doubles (0.1, 0.2, 0.4) and is capped (0.4): the delays the supervisor chose
    # (a bound on the whole run's wall time, 20 s, measured five process starts on a loaded
    # machine more than the cap)
    delays = [e["restart_in_s"] for e in rec.events("worker process died; restarting")]
    assert delays == [0.1, 0.2, 0.4, 0.4], delays
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # and kept: each start came at least that long after the one before (process start time
    # comes on top)
    for gap, least in zip(gaps, delays, strict=True):
        assert gap >= least, gaps


def test_a_child_that_ran_long_enough_restarts_quickly_every_time(tmp_path: Path):
    """Deaths spread out in time are not a crash loop: no give-up, the back-off stays at its
    minimum (stable_s = 0 makes every child count as one that ran long enough)."""
    starts = tmp_path / "starts"
    argv = _py(f"open({str(starts)!r}, 'a').write('x\\n'); raise SystemExit(1)")
    sup = Supervisor([argv], restart_min_s=0.05, restart_max_s=5, stable_s=0, give_up_after=3)
    sup.spawn(sup.slots[0])
    deadline = time.monotonic() + 60  # six process starts: a loaded machine's time
    while sup.restarts < 6 and time.monotonic() < deadline:
        assert sup.step()
        time.sleep(0.01)
    assert sup.restarts >= 6 and not sup.stopping
    assert sup.slots[0].failures == 1
    sup.stop()
    while sup.step():
        time.sleep(0.01)


def test_bad_options_stop_every_child_at_once_without_restarts(procs):
    p = procs.worker("--processes", "3", app="tests.apps.no_such_module:app")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2, err.decode()[-2000:]
    events = log_events(err)
    assert [e for e in events if e["event"] == "worker process died; restarting"] == []
    refused = [e for e in events
               if e["event"] == "worker process refused its options; stopping all, not restarting"]
    assert len(refused) == 1 and refused[0]["exit"] == "exit 2"
    assert "cannot import 'tests.apps.no_such_module'" in err.decode()


def test_sigkilled_child_is_replaced_and_its_runs_recover_through_lease_expiry(app, r, procs):
    port = free_ports(4)
    ports = list(range(port, port + 4))
    sup = procs.worker("--processes", "4", "--concurrency", "2", "--lease", "2s", "--grace", "5s",
                       "--metrics-port", str(port))
    procs.reaper("100ms")
    # deadlines for a loaded machine: four interpreters importing duetime side by side took
    # longer than 30 s to serve their metrics in a clean-clone CI run under a busy core
    wait_for(lambda: len(children(sup.pid)) == 4, 60, what="four worker processes")
    wait_for(lambda: all(serves_metrics(p) for p in ports), 90, what="every child's metrics port")
    ids = app.enqueue_many([(basic.slow, [1.5]) for _ in range(24)])
    wait_for(lambda: r.hlen(basic.count_key()) >= 8, 30, what="all eight slots busy")

    before = children(sup.pid)
    victim = sorted(before)[1]
    victim_port = metrics_port_of(victim)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in children(sup.pid) and len(children(sup.pid)) == 4, 20,
             what="the killed child to be replaced")
    (new,) = children(sup.pid) - before
    # until it has exec'd, a forked child's /proc cmdline is the supervisor's own (whose
    # --metrics-port is the first slot's): read the port once the child runs its own argv
    supervisor_argv = Path(f"/proc/{sup.pid}/cmdline").read_bytes()
    wait_for(lambda: Path(f"/proc/{new}/cmdline").read_bytes() != supervisor_argv, 20,
             what="the replacement to exec its own command line")
    assert metrics_port_of(new) == victim_port  # the same slot, on the same port
    wait_for(lambda: serves_metrics(victim_port), 20, what="the new child to serve metrics")

    wait_for(lambda: {app.get_run(i).state for i in ids} == {"succeeded"}, 60, what="24 succeeded")
    recovered = [i for i in ids if app.get_run(i).attempts[0].error == "lease expired"]
    assert recovered, "the killed child held no run: the test proved nothing about recovery"
    for i in recovered:
        assert [a.outcome for a in app.get_run(i).attempts] == ["unknown", "succeeded"]

    last = children(sup.pid)
    sup.send_signal(signal.SIGTERM)
    _, err = sup.communicate(timeout=60)
    assert sup.returncode == 0, err.decode()[-3000:]
    assert not [p for p in last if Path(f"/proc/{p}").exists()], "a child outlived the supervisor"
    restarts = [e for e in log_events(err) if e["event"] == "worker process died; restarting"]
    assert len(restarts) == 1
    assert restarts[0]["pid"] == victim and restarts[0]["exit"] == "SIGKILL"


def free_ports(n: int) -> int:
    """The first of n consecutive free ports (the children listen on port, port+1, ...)."""
    for _ in range(100):
        port = free_port()
        if port + n <= 65536 and all(bindable(p) for p in range(port, port + n)):
            return port
    raise AssertionError(f"no {n} consecutive free ports found")


