"""Script replies follow one convention: four shapes, each read by one decoder of
common/transitions.py, and every script's header names the shape of its reply."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from duetime.common import scripts
from duetime.common import transitions as tr

LUA = Path(__file__).resolve().parents[2] / "lua"
SHAPES = {"status", "counts", "each", "claim"}


def test_every_script_has_one_reply_shape():
    assert set(tr.REPLY) == set(scripts.SCRIPT_NAMES)
    assert set(tr.REPLY.values()) == SHAPES


@pytest.mark.parametrize("name", sorted(n for n, shape in tr.REPLY.items() if shape != "claim"))
def test_the_header_names_the_shape(name):
    """`-- Returns (<shape>) ...` (claim.lua documents its own layout, read by parse_claim)."""
    header = [ln for ln in (LUA / f"{name}.lua").read_text().splitlines() if ln.startswith("--")]
    shapes = [m.group(1) for ln in header if (m := re.match(r"-- Returns \((\w+)\)", ln))]
    assert shapes == [tr.REPLY[name]], (name, shapes)


def test_status_replies_alone_or_with_a_value():
    assert tr.status(b"released") == b"released"
    assert tr.status([b"retrying", 1700000000123]) == b"retrying"
    assert tr.status_detail(b"missing") == ("missing", "")
    assert tr.status_detail([b"created", b"r-2"]) == ("created", "r-2")
    assert tr.status_detail([b"updated", 4]) == ("updated", "4")


def test_counts_replies_one_or_several():
    assert tr.counts(1) == [1]
    assert tr.counts([3, 0, 2, -1]) == [3, 0, 2, -1]
