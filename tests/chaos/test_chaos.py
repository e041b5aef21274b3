"""The bounded chaos run, on Redis and on Valkey: the mixed load while workers and schedulers
are SIGKILLed, SIGSTOPped and SIGTERMed, the server is restarted (AOF `everysec` and `always`;
SIGKILL and SHUTDOWN), links are cut, stalled and slowed, and memory runs out -- then every
invariant of tests/chaos/checker.py must hold.

Each run goes through every fault episode once, in an order fixed by its seed, and takes
about a minute; the long, parameterised version is bench/chaos.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import EPISODES, ChaosConfig, run_chaos

pytestmark = pytest.mark.slow

# what each episode leaves in the fault log
EVIDENCE = {"worker_kill": "sigkill", "worker_stop": "sigstop", "worker_term": "sigterm",
            "scheduler_kill": "sigkill", "scheduler_stop": "sigstop", "link_cut": "cut",
            "link_stall": "stall", "link_slow": "slow",
            "server_sigkill_everysec": "server_sigkill(everysec)",
            "server_sigkill_always": "server_sigkill(always)", "oom": "oom"}


@pytest.mark.parametrize(("kind", "seed"), [("redis", 11), ("valkey", 12)])
def test_every_promise_holds_through_every_fault(kind: str, seed: int, tmp_path: Path) -> None:
    out = run_chaos(ChaosConfig(kind=kind, seed=seed, duration_s=30.0, workdir=tmp_path / "run"))
    report = out.report
    assert report.ok, f"{report.text()}\n(logs, journal, faults: {out.workdir})"

    # the run really exercised what the invariants speak about
    faults = report.counts["faults"]
    for episode in EPISODES:
        if episode in EVIDENCE:
            assert faults.get(EVIDENCE[episode], 0) >= 1, (episode, faults)
    assert any(k.startswith("server_shutdown") for k in faults), faults
    c = report.counts
    assert out.executions > 300 and c["succeeded"] > 300
    assert c["dead: injected failure"] == c["injected: failing runs"] > 0
    assert c["retried after the injected first-attempt failure"] > 0
    assert c["missed (observed)"] == c["injected: runs of the unserved schedule (all must be missed)"] > 0
    assert c["skipped (observed)"] > 0
    assert c["lease expiries (each explained by a fault)"] > 0
    assert c["schedule chaos-every: occurrences with a run"] >= 20
