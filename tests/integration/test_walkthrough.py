"""The README's Walkthrough, executed as written: its `sh` blocks as one bash session (with
`set -euo pipefail`), its `python` blocks as the files they name. Only the server URL and the
namespace come from the test."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import redis
from duetime.common.keys import Keyspace

from duetime.ops.inspect import Inspector
from tests.conftest import ROOT, wait_for

README = ROOT / "README.md"


def walkthrough() -> tuple[str, dict[str, str]]:
    """→ (the bash script, {file name: python source})."""
    section = README.read_text().split("## Walkthrough", 1)[1].split("\n## ", 1)[0]
    script, files = [], {}
    for lang, body in re.findall(r"```(sh|python)\n(.*?)```", section, re.S):
        if lang == "python":
            name = re.match(r"# (\S+\.py)\n", body)
            assert name, f"a python block must start with '# <file>.py':\n{body}"
            files[name.group(1)] = body
        else:
            # the test's server replaces the README's example URL
            script += [ln for ln in body.splitlines() if not ln.startswith("export DUETIME_REDIS_URL=")]
    return "\n".join(script), files


def test_readme_walkthrough_runs_as_written(url, namespace, tmp_path: Path):
    script, files = walkthrough()
    assert "duetime schedule add" in script and "redis-cli" in script and files
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    env = {**os.environ, "DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    bash = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    client = redis.Redis.from_url(url)
    insp = Inspector(client, Keyspace(namespace), url)
    seen: dict[str, object] = {}
    try:
        # bash exits after its last step; the scheduler and workers it started in the
        # background keep running (and hold its output pipes) until the group is stopped
        wait_for(lambda: bash.poll() is not None, 150, what="the walkthrough to finish")
        if bash.returncode == 0:
            batch = [r for r in insp.list_runs("succeeded", limit=1000).runs
                     if r.task == "demo.resize" and not r.schedule]
            seen = {"batch": len(batch), "run_workers": {r.worker for r in batch},
                    "live": {w.id for w in insp.workers()},
                    "thumbnails": len(insp.list_runs("succeeded", schedule="thumbnails").runs)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGTERM)  # the README's "kill %1 %2 %3"
        try:
            raw_out, raw_err = bash.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(bash.pid, signal.SIGKILL)
            raw_out, raw_err = bash.communicate()
        client.close()
    out, err = raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
    assert bash.returncode == 0, err[-4000:]
    # the single run, the service's and the 200 of the batch succeeded, shared by the workers
    assert seen["batch"] == 202 and seen["run_workers"] == seen["live"] and len(seen["live"]) == 2
    assert seen["thumbnails"] >= 1  # the schedule registered from the CLI fired and ran
    assert "created thumbnails: every 2s" in out
    assert "next 5 fire times (UTC / UTC)" in out
    assert re.search(r"^succeeded$", out, re.M)  # runs wait
    assert '"result": {\n    "image": "dog.png",\n    "width": 640\n  }' in out  # runs wait --json
    assert "{'image': 'owl.png', 'width': 128}" in out  # the asyncio service, by name
    assert "\nsucceeded\ndemo.resize\n" in out  # redis-cli HMGET of the run's hash
    assert "T:leases" in out and "redis-cli -u" in out  # duetime keys
    assert "DONE/s" in out and "default" in out  # top --once
    assert "Traceback" not in err
