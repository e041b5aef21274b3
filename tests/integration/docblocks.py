"""Documentation executed as written: a page's `sh` blocks become one bash session, its
`python` blocks the files they name (`# <file>.py` on their first line). The README's
walkthrough and the docs site's tutorial are both run this way, so they stay true."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT, wait_for


def blocks(text: str) -> tuple[str, dict[str, str]]:
    """→ (the bash script, {file name: python source}) of a page's code blocks, in order; the
    example server URL is left out (the test's own server replaces it)."""
    script, files = [], {}
    for lang, body in re.findall(r"```(sh|python)\n(.*?)```", text, re.S):
        if lang == "python":
            name = re.match(r"# (\S+\.py)\n", body)
            assert name, f"a python block must start with '# <file>.py':\n{body}"
            files[name.group(1)] = body
        else:
            script += [ln for ln in body.splitlines()
                       if not ln.startswith("export DUETIME_REDIS_URL=")]
    return "\n".join(script), files


def run_page(text: str, url: str, namespace: str, cwd: Path,
             observe: Callable[[], dict[str, object]], timeout: float = 150
             ) -> tuple[int, str, str, dict[str, object]]:
    """Write the page's files into `cwd`, run its script there with `set -euo pipefail`, call
    `observe()` after the script's last step while the processes it started in the background
    still run, then stop them all (SIGTERM to its process group, as `kill %1 ...` would).
    → (bash's exit code, stdout, stderr, what `observe` returned; {} when bash failed)."""
    script, files = blocks(text)
    for name, body in files.items():
        (cwd / name).write_text(body)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": f"{cwd}:{ROOT}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    bash = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    seen: dict[str, object] = {}
    try:
        # bash exits after its last step; the processes it started in the background keep
        # running (and hold its output pipes) until the group is stopped
        wait_for(lambda: bash.poll() is not None, timeout, what="the page's script to finish")
        if bash.returncode == 0:
            seen = observe()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGTERM)
        try:
            raw_out, raw_err = bash.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(bash.pid, signal.SIGKILL)
            raw_out, raw_err = bash.communicate()
    return (bash.returncode, raw_out.decode(errors="replace"), raw_err.decode(errors="replace"),
            seen)
