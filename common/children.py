"""Child processes of a duetime command (the reloader's worker, the children of
`--processes N`): the command line passed on to a child, and a child that dies with its
parent, so a parent killed with SIGKILL leaves nothing behind claiming runs. (A task's
isolated child sets its own death signal, first thing, before it imports duetime.)"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from collections.abc import Collection, Sequence

_PR_SET_PDEATHSIG = 1  # prctl(2)


def without_options(argv: Sequence[str], flags: Collection[str],
                    options: Collection[str]) -> list[str]:
    """`argv` without the `flags` (no value) and the `options` with their values, given as
    `--name value` or `--name=value`: what a parent takes for itself and does not pass on."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in flags:
            continue
        if word.split("=", 1)[0] in options:
            skip = "=" not in word
            continue
        out.append(word)
    return out


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """In the child (before exec, or first thing): the kernel sends `sig` when the parent dies,
    even by SIGKILL (Linux; elsewhere nothing: the child outlives its parent)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
