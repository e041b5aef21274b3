"""`duetime worker --reload`: the development loop. This process runs no worker itself; it runs
one as a child (the same command line without `--reload`), watches the source folders for
changes to `.py` files (watchfiles: the filesystem's own change notifications, debounced) and
replaces the child on each change.

A replacement is a normal stop: SIGTERM, in-flight runs get the worker's `--grace` and the rest
go back to their queue without spending an attempt, then a new child imports the new code. A
child that exits on its own (a syntax error in the file being edited) is started again at the
next change, not in a loop. For development only: in production a deploy replaces workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from duetime.common import logs
from duetime.common.children import die_with_parent, without_options

log = logs.get("duetime.reload")

# the options this process takes for itself and does not pass on to its child
OWN_FLAGS = frozenset({"--reload"})
OWN_OPTIONS = frozenset({"--reload-dir"})


def child_argv(argv: Sequence[str]) -> list[str]:
    """The duetime command line of the child: `argv` (what follows `duetime`) without the
    reload options, run by this Python."""
    return [sys.executable, "-m", "duetime", *without_options(argv, OWN_FLAGS, OWN_OPTIONS)]


class Reloader:
    """Runs `argv` as a child process and replaces it when a watched `.py` file changes."""

    def __init__(self, argv: list[str], paths: Sequence[Path], grace_s: float) -> None:
        self.argv, self.paths, self.grace_s = argv, [p.resolve() for p in paths], grace_s
        self.stop = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.child = subprocess.Popen(self.argv, preexec_fn=die_with_parent)
        self.starts += 1
        log.info("worker started", pid=self.child.pid, start=self.starts)

    def end_child(self) -> None:
        """SIGTERM, the worker's grace (and a margin) to stop, then SIGKILL."""
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(self.grace_s + 5)
        except subprocess.TimeoutExpired:
            log.warning("worker did not stop within its grace: killed", pid=child.pid)
            child.kill()
            child.wait()

    def run(self) -> int:
        from watchfiles import PythonFilter, watch

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop.set())
        self.start()
        log.info("watching for changes", paths=[str(p) for p in self.paths])
        exited_reported = False
        try:
            for changes in watch(*self.paths, watch_filter=PythonFilter(), stop_event=self.stop,
                                 yield_on_timeout=True, rust_timeout=500, debounce=300):
                if self.stop.is_set():
                    break
                child = self.child
                if child is not None and child.poll() is not None and not exited_reported:
                    log.warning("worker exited; it starts again at the next change",
                                code=child.returncode)
                    exited_reported = True
                if not changes:
                    continue
                files = sorted({os.path.relpath(p) for _, p in changes})
                log.info("change detected: restarting the worker", files=files[:10],
                         changed=len(files))
                self.end_child()
                self.start()
                exited_reported = False
        finally:
            self.end_child()
        return 0
