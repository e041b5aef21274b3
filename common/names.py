"""Validation of every name that ends up inside a Redis key or a message.

A `{` or `}` would change the hash tag (and so the cluster slot) of a key; control
characters make keys unreadable in redis-cli. `|` separates the fields of the wake notices
('<partition>|<queue>|<due ms>') and `,` the queue lists (`--queues`, a worker's record): a
name holding one would be read back as another. All are refused at the edge.
"""

from __future__ import annotations

import re

from duetime.common.errors import InvalidInput

MAX_NAME = 200
_BAD = re.compile(r"[{}|\x00-\x1f\x7f\s\ud800-\udfff]")
_BAD_IN_LIST = re.compile(r"[{}|,\x00-\x1f\x7f\s\ud800-\udfff]")
LISTED = frozenset({"queue"})  # kinds of names that travel in comma-separated lists


def check_name(kind: str, value: object) -> str:
    bad = _BAD_IN_LIST if kind in LISTED else _BAD
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME and not bad.search(value):
        return value
    return _explain(kind, value)


def _explain(kind: str, value: object) -> str:
    """The slow path: say exactly what is wrong."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{kind} must be a non-empty string, got {value!r}")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise InvalidInput(f"{kind} {value!r} is not valid UTF-8 text")
    if len(value) > MAX_NAME:
        raise InvalidInput(f"{kind} {value[:40]!r}... is longer than {MAX_NAME} characters")
    for ch in value:
        if ch in "{}":
            raise InvalidInput(f"{kind} {value!r} contains {ch!r} (braces would change the hash slot)")
        if ch == "|" or (ch == "," and kind in LISTED):
            raise InvalidInput(f"{kind} {value!r} contains {ch!r}, a separator of duetime's "
                               f"messages and lists")
        if ord(ch) < 32 or ord(ch) == 127 or ch.isspace():
            raise InvalidInput(f"{kind} {value!r} contains a control or whitespace character")
    raise InvalidInput(f"{kind} {value!r} is not a valid name")
