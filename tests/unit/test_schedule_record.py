"""The packed schedule record (common/schedules.py, docs/keys.md): a definition read back
through it is the one the old layout held, field for field, defaults included."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from duetime.common.schedules import (
    RECORD_KEYS,
    encode_record,
    expand_record,
    pack_definition,
    same_definition,
    unpack_record,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "schedules_before_packed.json"


def old_records() -> list[tuple[str, dict[str, bytes]]]:
    data = json.loads(FIXTURE.read_text())
    out = []
    for key, item in data["keys"].items():
        if ":sched:" in key and item["type"] == "hash":
            out.append((key.rsplit(":sched:", 1)[1],
                        {f: base64.b64decode(v) for f, v in item["value"].items()}))
    return out


@pytest.mark.parametrize(("name", "old"), old_records(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_definition_field_of_the_old_layout_reads_back_the_same(name, old):
    packed = pack_definition(name, old)
    back = expand_record(name, packed)
    for f in RECORD_KEYS:
        if old.get(f):  # a field the old layout held with a value
            assert back.get(f.encode()) == old[f], f
        else:  # absent or '' (none): none, or the default the old layout wrote
            assert back.get(f.encode()) in (None, b"") or f in ("stagger_ms",), f
    assert back[b"name"] == name.encode()
    assert same_definition(unpack_record(packed), name, old)
    # defaults (the queue, task options, an every's epoch anchor) are not stored
    rec = unpack_record(packed)
    assert not {b"q", b"ma", b"bb", b"bm", b"to", b"id", b"a", b"z", b"s", b"mc"} & set(rec)


def test_entries_are_length_prefixed_so_any_payload_reads_back():
    payload = b"\x92\x91\x01\x80:3:p9:\x00\xff"
    raw = encode_record({"p": payload, "k": b"every", "v": b"12"})
    assert raw.startswith(b"k5:every")
    assert unpack_record(raw) == {b"k": b"every", b"p": payload, b"v": b"12"}
    with pytest.raises(ValueError):
        unpack_record(raw[:-1])
    with pytest.raises(ValueError):
        unpack_record(b"K3:abc")
