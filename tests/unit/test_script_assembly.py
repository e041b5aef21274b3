"""How the Lua scripts are put together: key suffixes from one table, only the helpers a
script uses, a line numbering that names the file, flags where they matter."""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from pathlib import Path

import pytest
from duetime.common import scripts
from duetime.common.keys import GLOBAL, SUFFIX, Keyspace
from duetime.common.models import STATES

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "lua"
CODE = [ROOT / d for d in ("duetime", "common", "scheduler", "worker")]
# a suffix that is followed by a name (`run:`, `due:`, ...), and the whole-key suffixes
NAMED = sorted({s for s in [*SUFFIX.values(), *GLOBAL.values()] if s.endswith(":")})
WHOLE = sorted({s for s in [*SUFFIX.values(), *GLOBAL.values()] if not s.endswith(":")})


def _alt(words: list[str]) -> str:
    return "(" + "|".join(map(re.escape, words)) + ")"


def test_no_key_suffix_is_spelled_in_a_lua_script() -> None:
    """Scripts name keys `prefix .. K.<kind> .. id`; a quoted suffix would be a second
    spelling that common/keys.py cannot change."""
    named = re.compile(r"""['"]""" + _alt(NAMED))
    joined = re.compile(r"""\.\.\s*['"]""" + _alt(WHOLE) + """['"]""")
    found = []
    for path in sorted(LUA.rglob("*.lua")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            if named.search(code) or joined.search(code):
                found.append(f"{path.relative_to(LUA)}:{n}: {line.strip()}")
    assert not found, "key suffixes spelled outside common/keys.py:\n" + "\n".join(found)


def _literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every one-line string literal; docstrings and other triple-quoted prose
    are left out."""
    out = []
    for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if t.type == tokenize.STRING:
            body = t.string.lstrip("rbfuRBFU")
            if not body.startswith(('"""', "'''")):
                out.append((t.start[0], body[1:-1]))
    return out


def test_no_key_suffix_is_spelled_in_python_outside_keys_py() -> None:
    """A key name is built by a Keyspace method; a string like `"run:"`, `":due:"` or
    `"}leases"` elsewhere would be a second spelling."""
    named = re.compile(r"(^|[:}])" + _alt(NAMED))
    whole = re.compile(r"[:}]" + _alt(WHOLE) + "$")
    found = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
             for top in CODE for path in sorted(top.rglob("*.py"))
             if path != ROOT / "common" / "keys.py"
             for line, text in _literals(path) if named.search(text) or whole.search(text)]
    assert not found, "key suffixes spelled outside common/keys.py:\n" + "\n".join(found)


def test_every_key_kind_has_a_keyspace_method_of_its_name() -> None:
    k = Keyspace("ns", 4)
    for name, suffix in SUFFIX.items():
        build = getattr(k, name)
        args = (0,) if not suffix.endswith(":") else (0, "x")
        assert build(*args) == k.prefix(0) + suffix + ("x" if len(args) == 2 else "")


def test_scripts_get_the_suffixes_from_keys_py() -> None:
    src = scripts.source("complete")
    assert "K.run" not in src and repr(SUFFIX["run"]) in src


def test_an_unknown_key_kind_is_refused_when_the_scripts_are_assembled() -> None:
    with pytest.raises(ValueError, match="K.nosuchkind"):
        scripts._suffixes("local k = prefix .. K.nosuchkind .. id", "x.lua")


def test_each_script_carries_only_the_helpers_it_uses() -> None:
    lib = scripts.helpers()
    assert {"now_ms", "int_s", "emit", "retry_or_dead", "leave_running"} <= lib.keys()
    enqueue = scripts.source("enqueue")
    assert "local function now_ms" in enqueue and "local function int_s" in enqueue
    for unused in ("retry_or_dead", "leave_running", "push_attempt", "emit", "backoff_ms"):
        assert f"local function {unused}" not in enqueue
    # a helper's own dependencies come with it (retry_or_dead uses backoff_ms and add_due)
    fail = scripts.source("fail")
    assert "local function backoff_ms" in fail and "local function add_due" in fail
    assert "local function finish_unstarted" not in fail
    assert "local function" not in scripts.source("schedule_delete")


def _span(file: str) -> scripts.Span:
    [span] = [s for s in scripts.layout() if s.file == file]
    return span


def test_line_numbers_of_the_assembled_scripts_name_the_file() -> None:
    lib = (LUA / "_lib.lua").read_text().splitlines()
    for name in scripts.SCRIPT_NAMES:
        src = scripts.source(name).splitlines()
        own = f"{name}.lua"
        for file in [*scripts.includes((LUA / own).read_text()), own]:
            base = _span(file).first
            for n, line in enumerate((LUA / file).read_text().splitlines(), 1):
                if file == own and n == 1 and line.startswith("#!"):
                    assert src[0] == line  # flags stay on the first line
                    continue
                assert src[base + n - 2] == scripts._suffixes(line, file), (file, n)
                assert scripts.locate(base + n - 1) == f"{file}:{n}"
        for n, line in enumerate(src[: len(lib)], 1):
            if line and not line.startswith("#!"):
                assert scripts._suffixes(lib[n - 1], "_lib.lua") == line
                assert scripts.locate(n) == f"_lib.lua:{n}"
    line = _span("claim.lua").first + 29  # claim.lua, line 30
    msg = f"ERR user_script:{line}: attempt to index a nil value on @user_script:{line}."
    assert scripts.explain(msg) == (
        "ERR claim.lua:30: attempt to index a nil value on @claim.lua:30.")
    step = _span("claim/lanes.lua").first + 11
    assert scripts.explain(f"user_script:{step}: x") == "claim/lanes.lua:12: x"
    last = scripts.layout()[-1]
    assert scripts.locate(last.first + last.count) == f"user_script:{last.first + last.count}"


def test_every_file_of_lua_has_a_line_range_of_its_own() -> None:
    spans = scripts.layout()
    files = {str(p.relative_to(LUA)) for p in LUA.rglob("*.lua")}
    assert {s.file for s in spans} == files  # every step file is included by a script
    for a, b in zip(spans, spans[1:], strict=False):
        assert a.first + a.count < b.first


def _reader(files: dict[str, str]) -> scripts.Reader:
    def read(name: str) -> str:
        if name in files:
            return files[name]
        return (LUA / name).read_text()
    return read


def test_a_script_of_any_size_assembles_and_keeps_its_line_numbers() -> None:
    """The numbering is computed from the files' sizes: no ceiling on a script's length."""
    body = "#!lua\n" + "\n".join(f"local x{i} = {i}" for i in range(1200)) + "\nreturn x1\n"
    read = _reader({"wait.lua": body})
    src = scripts.assemble("wait", read).splitlines()
    first = [s for s in scripts._layout(read) if s.file == "wait.lua"][0].first
    assert src[0] == "#!lua" and src[first - 1] == scripts.SLOT_GUARD
    assert src[first + 1199] == "local x1199 = 1199"


def test_a_script_carries_its_step_files_whole_and_the_helpers_they_use() -> None:
    src = scripts.source("claim")
    for file in scripts.includes((LUA / "claim.lua").read_text()):
        assert file.startswith("claim/")
        for line in (LUA / file).read_text().splitlines():
            assert scripts._suffixes(line, file) in src
    # finish_unstarted is used by claim/admission.lua only, not by claim.lua's own lines
    assert "finish_unstarted" not in (LUA / "claim.lua").read_text()
    assert "local function finish_unstarted" in src
    assert "local function retry_or_dead" not in src


def test_a_step_used_before_its_definition_is_refused() -> None:
    files = {"claim/next_due.lua": "local function next_due(c)\n  return later(c)\nend\n"
             "local function later(c)\n  return 1\nend\n"}
    with pytest.raises(ValueError, match="`next_due` uses `later`"):
        scripts.assemble("claim", _reader(files))


def test_a_step_file_with_a_statement_is_refused() -> None:
    """A step file runs before the script's slot check: definitions only."""
    files = {"claim/next_due.lua": "redis.call('DEL', KEYS[1])\n"}
    with pytest.raises(ValueError, match="holds only definitions"):
        scripts.assemble("claim", _reader(files))


def test_held_scan_is_one_named_constant() -> None:
    text = "\n".join(p.read_text() for p in sorted(LUA.rglob("*.lua")))
    assert text.count("local HELD_SCAN = 32") == 1
    code = [scripts._strip_comment(line) for line in text.splitlines()]
    assert not [line for line in code if re.search(r"\b3[12]\b", line) and "HELD_SCAN" not in line
                and "LANES_PER_CLAIM" not in line]


def test_memory_flags_match_what_each_script_may_do() -> None:
    """At maxmemory: a heartbeat, a partition-lease renewal and the deleting scripts still run;
    every other script is refused before it writes (a shebang without allow-oom)."""
    allow_oom = {n for n in scripts.SCRIPT_NAMES
                 if scripts.source(n).startswith("#!lua flags=allow-oom")}
    assert allow_oom == {"heartbeat", "partition_owners", "purge", "schedule_delete"}
    for n in scripts.SCRIPT_NAMES:
        assert scripts.source(n).startswith("#!lua"), n


def test_lua_knows_the_same_run_states_as_python() -> None:
    src = (LUA / "_lib.lua").read_text()
    block = re.search(r"local STATES = \{(.*?)\}", src, re.S).group(1)
    assert set(re.findall(r"(\w+) = true", block)) == set(STATES)


def test_every_script_first_checks_whether_its_slot_is_moving() -> None:
    """The resharding guard (scripts.SLOT_GUARD) runs before anything else in every script;
    tests/integration/test_reshard.py shows what it prevents."""
    for name in scripts.SCRIPT_NAMES:
        lines = scripts.source(name).splitlines()
        first = _span(f"{name}.lua").first
        assert lines[first - 1] == scripts.SLOT_GUARD, name  # its own line 1, before its code


def _written(text: str, slot: str) -> list[str]:
    """The `-- name` of each `out[<slot> N] = ...` line, in the order of N."""
    got = re.findall(r"^\s*out\[" + re.escape(slot) + r"(\d+)\] = .*--\s*(\w+)\s*$", text, re.M)
    return [name for _, name in sorted(got, key=lambda x: int(x[0]))]


def test_the_claim_reply_is_written_and_read_by_the_same_names() -> None:
    """claim.lua's header, the Lua that writes the reply and common/transitions.py, which
    reads it by name, list the same fields in the same order."""
    from duetime.common import transitions as tr

    claim = (LUA / "claim.lua").read_text()
    head = re.search(r"^-- Reply header: (.*)$", claim, re.M)
    runs = re.search(r"^-- Reply per run: (.*(?:\n--   .*)*)", claim, re.M)
    assert head and runs
    header, per_run = head.group(1).split(), runs.group(1).replace("--", " ").split()
    assert tuple(header) == tr.CLAIM_REPLY_HEADER
    assert tuple(per_run) == tr.CLAIM_RUN_FIELDS
    head_doc = re.search(r"^-- Reply head: (.*)$", claim, re.M)
    assert head_doc and tuple(head_doc.group(1).split()) == tr.CLAIM_HEAD_FIELDS
    assert tuple(_written(claim, "")) == tr.CLAIM_REPLY_HEADER
    extra = re.search(r"^-- Reply extra: (.*(?:\n--   .*)*)", claim, re.M)
    assert extra
    assert tuple(extra.group(1).replace("--", " ").split()) == tr.CLAIM_EXTRA_FIELDS
    lease = (LUA / "claim" / "lease.lua").read_text()
    assert tuple(_written(lease, "o + ")) == tr.CLAIM_RUN_FIELDS
    # the head is written in the documented order: fence, attempt, ready, id
    joined = re.search(r"^\s*out\[o \+ 1\] = (.*?)\s*--\s*head\s*$", lease, re.M)
    assert joined
    assert [v.strip() for v in joined.group(1).split(".. ' ' ..")] == [
        "fence_s", "attempt_s", "ready", "id"]
    got = re.findall(r"^\s*x\[(\d+)\] = .*--\s*(\w+)\s*$", lease, re.M)
    assert tuple(name for _, name in sorted(got, key=lambda x: int(x[0]))) == tr.CLAIM_EXTRA_FIELDS
    fields = {f.name for f in dataclasses.fields(tr.Claimed)}
    assert ((set(tr.CLAIM_RUN_FIELDS) - {"extra", "head"}) | set(tr.CLAIM_HEAD_FIELDS)
            | set(tr.CLAIM_EXTRA_FIELDS)) <= fields


def _tested_by(path: Path) -> list[str]:
    m = re.search(r"^-- Tested by: (.*(?:\n--   .*)*)", path.read_text(), re.M)
    assert m, f"{path.relative_to(LUA)} has no `-- Tested by:` line"
    return m.group(1).replace("--", " ").replace(",", " ").split()


def test_every_script_names_the_tests_that_cover_it() -> None:
    """A newcomer changing a script (or a step of claim.lua) knows which tests to run:
    `pytest $(the files of its Tested by line)`."""
    for path in sorted(LUA.rglob("*.lua")):
        named = _tested_by(path)
        assert named, path
        for test in named:
            assert test.startswith("tests/") and test.endswith(".py"), (path, test)
            assert (ROOT / test).is_file(), f"{path.relative_to(LUA)} names {test}: no such file"
