"""The scripts read a limit by the field names common/limit_fields.py defines: the fields are
written here by those names alone (no duetime/client/limits.py), and claim.lua obeys them."""

from __future__ import annotations

import re
from pathlib import Path

from duetime.common import limit_fields
from duetime.common import transitions as tr
from duetime.common.scripts import Scripts

from tests.apps import basic

LUA = Path(__file__).resolve().parents[2] / "lua"


def _lua_sources() -> str:
    return "\n".join(p.read_text() for p in sorted(LUA.rglob("*.lua")))


def test_the_scripts_spell_the_suffixes_and_kinds_of_limit_fields_py():
    src = _lua_sources()
    suffixes = set(re.findall(r"'(:[a-z])'", src))  # `scope .. ':c'`
    assert suffixes == {":" + s for s in limit_fields.SUFFIX.values()}
    for kind in limit_fields.KINDS:  # the scopes claim.lua builds from a run
        assert f"'{kind}:'" in src, kind


def _claim(app, r, p):
    keys, args = tr.claim(app.keys, p, "default", "w", 10, 10_000)
    return tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs


def _hand_written_limit(app, r, what, value):
    """A limit of tenant acme written straight into its home partition's T:limits hash."""
    p = app.keys.partition_of_tenant("acme")
    scope = limit_fields.scope("tenant", "acme")
    r.hset(app.keys.limits(p), limit_fields.field(scope, what), value)
    ids = [app.enqueue(basic.noop, [i], tenant="acme") for i in range(3)]
    return p, ids


def test_claim_obeys_a_concurrency_limit_written_by_these_names(app, r):
    p, ids = _hand_written_limit(app, r, "concurrency", 1)
    assert len(_claim(app, r, p)) == 1
    assert _claim(app, r, p) == []
    assert {app.get_run(i).limited_by for i in ids} >= {"tenant:acme:concurrency"}


def test_claim_obeys_a_rate_limit_written_by_these_names(app, r):
    p, ids = _hand_written_limit(app, r, "rate", "0.000001 1")  # a burst of one, then ~nothing
    assert len(_claim(app, r, p)) == 1
    assert _claim(app, r, p) == []
    assert {app.get_run(i).limited_by for i in ids} >= {"tenant:acme:rate"}


def test_claim_reads_a_tenant_weight_written_by_this_name(app, r):
    """Two tenants' lanes, one of weight 3: a batch of 4 takes 3 of its runs and 1 other."""
    p = app.keys.partition_of_tenant("acme")
    other = next(f"t{i}" for i in range(1000) if app.keys.partition_of_tenant(f"t{i}") == p)
    r.hset(app.keys.limits(p), limit_fields.field(limit_fields.scope("tenant", "acme"), "weight"), 3)
    acme = {app.enqueue(basic.noop, [i], tenant="acme") for i in range(6)}
    for i in range(6):
        app.enqueue(basic.noop, [i], tenant=other)
    keys, args = tr.claim(app.keys, p, "default", "w", 4, 10_000)
    runs = tr.parse_claim(Scripts(r).claim(keys=keys, args=args)).runs
    assert sum(c.run_id in acme for c in runs) == 3 and len(runs) == 4
