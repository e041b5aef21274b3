"""Validation of every name that ends up inside a Redis key or a message.

A `{` or `}` would change the hash tag (and so the cluster slot) of a key; control
characters make keys unreadable in redis-cli. `|` separates the fields of the wake notices
('<partition>|<queue>|<due ms>') and `,` the queue lists (`--queues`, a worker's record): a
name holding one would be read back as another. Unicode format characters (category Cf: the
right-to-left override, zero-width spaces and joiners) are invisible and reorder what a
listing shows (a task named `evil\u202egnp.exe` lists as `evilexe.png`). All are refused at
the edge.
"""

from __future__ import annotations

import re
import unicodedata

from duetime.common.errors import InvalidInput

MAX_NAME = 200
MAX_OWNER = 100  # an owner is a team's name, shown in listings and metric labels
_BAD = re.compile(r"[{}|\x00-\x1f\x7f\s\ud800-\udfff]")
_BAD_IN_LIST = re.compile(r"[{}|,\x00-\x1f\x7f\s\ud800-\udfff]")
LISTED = frozenset({"queue"})  # kinds of names that travel in comma-separated lists


def check_name(kind: str, value: object) -> str:
    bad = _BAD_IN_LIST if kind in LISTED else _BAD
    if (isinstance(value, str) and 0 < len(value) <= MAX_NAME and not bad.search(value)
            and (value.isascii() or not _format_char(value))):
        return value
    return _explain(kind, value)


def check_owner(value: object) -> str | None:
    """A task's or schedule's owner: optional (None or ''), else a name of at most MAX_OWNER
    characters (spaces allowed, inside), no control or format characters."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"owner must be a string, got {value!r}")
    if len(value) > MAX_OWNER:
        raise InvalidInput(f"owner {value[:40]!r}... is longer than {MAX_OWNER} characters")
    if value != value.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise InvalidInput(f"owner {value!r} contains a control character or surrounding space")
    if _format_char(value) or _BAD_SURROGATE.search(value) or any(ch in "{}|" for ch in value):
        raise InvalidInput(f"owner {value!r} contains an invisible format character, a brace "
                           f"or '|'")
    return value


_BAD_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _format_char(value: str) -> str | None:
    """The first Unicode format character (category Cf) in `value`, if any."""
    for ch in value:
        if not ch.isascii() and unicodedata.category(ch) == "Cf":
            return ch
    return None


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
    fmt = _format_char(value)
    if fmt is not None:
        raise InvalidInput(f"{kind} {value!r} contains the invisible format character "
                           f"U+{ord(fmt):04X} ({unicodedata.name(fmt, 'unnamed')})")
    raise InvalidInput(f"{kind} {value!r} is not a valid name")
