"""The README's Walkthrough, executed as written: its `sh` blocks as one bash session (with
`set -euo pipefail`), its `python` blocks as the files they name. Only the server URL and the
namespace come from the test."""

from __future__ import annotations

import re
from pathlib import Path

import redis
from duetime.common.keys import Keyspace

from duetime.ops.inspect import Inspector
from tests.conftest import ROOT
from tests.integration.docblocks import blocks, run_page

README = ROOT / "README.md"


def section() -> str:
    """The README's Walkthrough section."""
    return README.read_text().split("## Walkthrough", 1)[1].split("\n## ", 1)[0]


def test_readme_walkthrough_runs_as_written(url, namespace, tmp_path: Path):
    script, files = blocks(section())
    assert "duetime schedule add" in script and "redis-cli" in script and files
    client = redis.Redis.from_url(url)
    insp = Inspector(client, Keyspace(namespace), url)

    def observe() -> dict[str, object]:
        batch = [r for r in insp.list_runs("succeeded", limit=1000).runs
                 if r.task == "demo.resize" and not r.schedule]
        return {"batch": len(batch), "run_workers": {r.worker for r in batch},
                "live": {w.id for w in insp.workers()},
                "thumbnails": len(insp.list_runs("succeeded", schedule="thumbnails").runs)}

    try:
        code, out, err, seen = run_page(section(), url, namespace, tmp_path, observe)
    finally:
        client.close()
    assert code == 0, err[-4000:]
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


def test_readme_hello_world_runs_as_written(url, namespace, tmp_path: Path):
    """The README's hello world: a module of the user's own, a worker, one enqueue and wait."""
    text = README.read_text().split("## Hello world", 1)[1].split("\n## ", 1)[0]
    script, files = blocks(text)
    assert set(files) == {"jobs.py"} and "duetime worker --app jobs:app" in script
    code, out, err, _ = run_page(text, url, namespace, tmp_path, dict)
    assert code == 0, err[-4000:]
    assert out.splitlines()[-1] == "5"
    assert "Traceback" not in err
