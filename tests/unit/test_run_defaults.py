"""The run fields a namespace of format 3 leaves out are read back as the very values a
default task sends (docs/keys.md "The run record"): lua/_lib.lua RUN_DEFAULTS, the readers'
defaults in common/models.py, and what duetime/client/runs.py task_fields writes for a task
left at its defaults must agree, or a run would change its queue or retry policy when its
field is left out."""

from __future__ import annotations

import re
from pathlib import Path

from duetime.common.models import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from duetime.common.tasks import TaskSpec

from duetime.client.runs import task_fields

LIB = Path(__file__).resolve().parents[2] / "lua" / "_lib.lua"


def _lua_defaults() -> dict[str, str]:
    block = re.search(r"^local RUN_DEFAULTS = \{(.*?)\}", LIB.read_text(), re.M | re.S)
    assert block, "RUN_DEFAULTS not found in lua/_lib.lua"
    return dict(re.findall(r"(\w+) = '([^']*)'", block.group(1)))


def test_the_left_out_fields_are_a_default_tasks_values() -> None:
    spec = TaskSpec(name="t")
    sent = task_fields(spec, spec.queue)
    sent_as = {str(sent[i]): str(sent[i + 1]) for i in range(0, len(sent), 2)}
    lua = _lua_defaults()
    assert set(lua) == {"queue", "max_attempts", "backoff_base", "backoff_max"}
    # what the producer sends for a default task is what the scripts leave out
    assert {k: sent_as[k] for k in lua} == lua
    # and what the Python readers put back
    assert lua["queue"] == DEFAULT_QUEUE and int(lua["max_attempts"]) == DEFAULT_MAX_ATTEMPTS
