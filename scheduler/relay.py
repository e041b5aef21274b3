"""The dependency relay: carries dependency notices and link requests between partitions
(docs/workloads.md), run by the reaper (scheduler/reaper.py).

A run ending in partition P whose dependent waits in partition Q leaves the notice
`Q|dependent|dep|state` in P's T:depnotes (lua/_lib.lua `settle_dependents`); a producer that
enqueued a run depending on one in another partition leaves its link request in T:deplinks
until it has linked it itself (duetime/client/workloads.py `Workloads.link`). A relay pass
reads the lists of the partitions it is given, then, each step one pipeline:

1. each link request: deps_link.lua on its dependency's partition;
2. per target partition, one deps_apply.lua with every notice of the pass for it (and the
   link requests that found their dependency ended), whichever partition it was read from;
3. per partition read, one deps_done.lua removing what was applied, as it was read.

An entry is removed only after it was applied, and applying one twice changes nothing, so two
relays, or a relay that dies halfway, never lose or double one: what was read but not applied
or not removed is read again. A script call runs on one partition's slot, so the removal,
on the partition the entry was read from, is a call of its own (on a cluster the two are
usually on different nodes).

Scheduler-side only: a scheduler process imports no producer module for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from duetime.common import transitions as tr
from duetime.common.keys import Keyspace
from duetime.common.scripts import Scripts

RELAY_BATCH = 100  # notices (and link requests) read per partition per relay pass
APPLY_CHUNK = 500  # notices per deps_apply call: bounds how long one script holds the server

Entry = tuple[int, str, bytes]  # (partition read from, 'n' notice or 'l' link request, as read)


@dataclass
class Relayed:
    """What one relay pass did."""

    applied: int = 0  # notices and link requests applied, then removed
    # partitions to read again next pass: a list read full (more may wait), an entry not
    # applied or not removed (a call the server refused). A list read short of RELAY_BATCH
    # was emptied: an entry appended since came with its own relay notice.
    again: set[int] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)  # what the server or a damaged entry said


def _failed(out: Relayed, res: Any, *partitions: int) -> bool:
    """True when `res` is a failed call's exception: a refusal (a damaged key) is noted and
    its partitions are read again; anything else (a lost connection) ends the pass, which is
    then read again whole."""
    if not isinstance(res, Exception):
        return False
    if not isinstance(res, redis.ResponseError):
        raise res
    out.refused.append(str(res))
    out.again.update(partitions)
    return True


def relay_pass(client: Any, keys: Keyspace, scripts: Scripts,
               partitions: Iterable[int] | None = None) -> Relayed:
    """Apply the notices (T:depnotes) and link requests (T:deplinks) waiting in the given
    partitions (all by default), at most RELAY_BATCH of each list per partition (see the
    module docstring)."""
    parts = list(range(keys.partitions) if partitions is None else partitions)
    out = Relayed()
    pipe = client.pipeline(transaction=False)
    for p in parts:
        pipe.lrange(keys.depnotes(p), 0, RELAY_BATCH - 1)
        pipe.lrange(keys.deplinks(p), 0, RELAY_BATCH - 1)
    got = pipe.execute(raise_on_error=False)
    read: dict[int, tuple[list[bytes], list[bytes]]] = {}
    for i, p in enumerate(parts):
        notes, links = got[2 * i], got[2 * i + 1]
        # a damaged list is noted (the log names it) and waits for the safety read; the
        # other list and the other partitions go on
        _failed(out, notes)
        _failed(out, links)
        notes = notes if isinstance(notes, list) else []
        links = links if isinstance(links, list) else []
        if notes or links:
            read[p] = (notes, links)
        if len(notes) >= RELAY_BATCH or len(links) >= RELAY_BATCH:
            out.again.add(p)
    if not read:
        return out
    applies: dict[int, list[tuple[Entry, tuple[str, str, str]]]] = {}  # target -> notices
    ok: set[Entry] = set()  # applied (or nothing to apply): to be removed
    for p, (notes, _) in sorted(read.items()):
        for raw in notes:
            try:
                tp, dependent, dep, state = raw.decode().split("|", 3)
                applies.setdefault(int(tp), []).append(((p, "n", raw), (dependent, dep, state)))
            except ValueError:
                out.refused.append(f"a malformed dependency notice in partition {p}: {raw!r}")
    _links(client, keys, scripts, read, out, applies, ok)
    pipe = client.pipeline(transaction=False)
    calls: list[list[Entry]] = []  # the entries of each deps_apply call
    for target, items in sorted(applies.items()):
        for i in range(0, len(items), APPLY_CHUNK):
            chunk = items[i:i + APPLY_CHUNK]
            keys_, args = tr.deps_apply(keys, target, [n for _, n in chunk])
            scripts.deps_apply(keys=keys_, args=args, client=pipe)
            calls.append([e for e, _ in chunk])
    for entries, res in zip(calls, pipe.execute(raise_on_error=False) if calls else [],
                                   strict=True):
        if not _failed(out, res, *(e[0] for e in entries)):
            ok.update(entries)
    pipe = client.pipeline(transaction=False)
    removals: list[tuple[int, int]] = []
    for p, (notes, links) in sorted(read.items()):
        done_notes = [raw for raw in notes if (p, "n", raw) in ok]
        done_links = [raw for raw in links if (p, "l", raw) in ok]
        if done_notes or done_links:
            keys_, args = tr.deps_done(keys, p, done_notes, done_links)
            scripts.deps_done(keys=keys_, args=args, client=pipe)
            removals.append((p, len(done_notes) + len(done_links)))
    for (p, n), res in zip(removals, pipe.execute(raise_on_error=False) if removals else [],
                           strict=True):
        if not _failed(out, res, p):
            out.applied += n
    return out


def _links(client: Any, keys: Keyspace, scripts: Scripts,
           read: dict[int, tuple[list[bytes], list[bytes]]], out: Relayed,
           applies: dict[int, list[tuple[Entry, tuple[str, str, str]]]], ok: set[Entry]) -> None:
    """Step 1: deps_link.lua for each link request read (one call each, pipelined); one that
    found its dependency ended joins the notices of its own partition (`applies`), one
    linked is done (`ok`)."""
    pipe = client.pipeline(transaction=False)
    sent: list[tuple[Entry, str, str]] = []
    for p, (_, links) in sorted(read.items()):
        for raw in links:
            try:
                dp, dep, dependent = raw.decode().split("|", 2)
                keys_, args = tr.deps_link(keys, int(dp), dep, p, dependent)
            except ValueError:
                out.refused.append(f"a malformed dependency link request in partition {p}: {raw!r}")
                continue
            scripts.deps_link(keys=keys_, args=args, client=pipe)
            sent.append(((p, "l", raw), dep, dependent))
    if not sent:
        return
    for (entry, dep, dependent), res in zip(sent, pipe.execute(raise_on_error=False), strict=True):
        if _failed(out, res, entry[0]):
            continue
        word, state = tr.status_detail(res)
        if word in ("ended", "missing"):
            applies.setdefault(entry[0], []).append((entry, (dependent, dep, state or "missing")))
        else:
            ok.add(entry)


def relay_once(client: Any, keys: Keyspace, scripts: Scripts,
               partitions: Iterable[int] | None = None) -> int:
    """One relay pass (`relay_pass`) over the given partitions (all by default); → how many
    notices and link requests were applied and removed."""
    return relay_pass(client, keys, scripts, partitions).applied
