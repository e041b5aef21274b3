"""Validation of every name that ends up inside a Redis key.

A `{` or `}` would change the hash tag (and so the cluster slot) of a key; control
characters make keys unreadable in redis-cli. Both are refused at the edge.
"""

from __future__ import annotations

import re

from duetime.common.errors import InvalidInput

MAX_NAME = 200
_BAD = re.compile(r"[{}\x00-\x1f\x7f\s]")


def check_name(kind: str, value: object) -> str:
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME and not _BAD.search(value):
        return value
    return _explain(kind, value)


def _explain(kind: str, value: object) -> str:
    """The slow path: say exactly what is wrong."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{kind} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME:
        raise InvalidInput(f"{kind} {value[:40]!r}... is longer than {MAX_NAME} characters")
    for ch in value:
        if ch in "{}":
            raise InvalidInput(f"{kind} {value!r} contains {ch!r} (braces would change the hash slot)")
        if ord(ch) < 32 or ord(ch) == 127 or ch.isspace():
            raise InvalidInput(f"{kind} {value!r} contains a control or whitespace character")
    raise InvalidInput(f"{kind} {value!r} is not a valid name")
