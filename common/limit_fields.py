"""The names of a limit's fields in a partition's T:limits hash, spelled here and nowhere else
in Python.

duetime/client/limits.py writes them, claim.lua reads them (and lua/_lib.lua `free_limits` the
concurrency one): a field is '<scope>:<suffix>' with the scope '<kind>:<name>', the kind one of
KINDS (claim.lua builds the scopes of a run from its tenant, its queue and its task).
tests/limits/test_limit_fields.py checks that the scripts spell the same suffixes and kinds and
obey a limit written by these names.
"""

from __future__ import annotations

KINDS = ("tenant", "queue", "task")
# what is limited -> the suffix of its field; values: 'c' an integer, 'r' '<tokens per ms>
# <burst>', 'w' a tenant's weight in its lanes' round robin
SUFFIX = {"concurrency": "c", "rate": "r", "weight": "w"}


def scope(kind: str, name: str) -> str:
    """The scope of a limit: '<kind>:<name>' (the T:limrun and T:bucket keys end with it)."""
    return f"{kind}:{name}"


def field(scope: str, what: str) -> str:
    """The T:limits field of `what` ('concurrency', 'rate' or 'weight') for `scope`."""
    return f"{scope}:{SUFFIX[what]}"


def fields(scope: str) -> tuple[str, ...]:
    """Every T:limits field a limit of `scope` may have."""
    return tuple(field(scope, what) for what in SUFFIX)
