"""The docs site's tutorial (docs/tutorial.md), executed as written: its `sh` blocks as one
bash session, its `python` blocks as the files they name, in an empty folder. Only the server
URL and the namespace come from the test."""

from __future__ import annotations

from pathlib import Path

import redis
from duetime.common.keys import Keyspace

from duetime.ops.inspect import Inspector
from tests.conftest import ROOT, wait_for
from tests.integration.docblocks import blocks, run_page

TUTORIAL = ROOT / "docs" / "tutorial.md"


def test_the_tutorial_runs_as_written(url, namespace, tmp_path: Path):
    text = TUTORIAL.read_text()
    script, files = blocks(text)
    assert set(files) == {"tasks.py", "hello.py", "flaky.py", "schedules.py", "test_tasks.py"}
    client = redis.Redis.from_url(url)
    insp = Inspector(client, Keyspace(namespace), url)

    def observe() -> dict[str, object]:
        # the scheduler started in the background creates greet-often's runs every second
        wait_for(lambda: len(insp.list_runs("succeeded", schedule="greet-often").runs) >= 2,
                 60, what="runs of greet-often created by the scheduler")
        flaky = [r for r in insp.list_runs("succeeded", limit=100).runs if r.task == "flaky.fetch"]
        return {"flaky_attempts": [r.attempt for r in flaky]}

    try:
        code, out, err, seen = run_page(text, url, namespace, tmp_path, observe)
    finally:
        client.close()
    assert code == 0, err[-4000:]
    assert "hello, world" in out  # hello.py
    assert "fetched https://example.com/report" in out  # flaky.py, after its retry
    assert seen["flaky_attempts"] == [2]  # the first attempt was retried, the second succeeded
    assert "next 5 fire times (Europe/Paris / UTC)" in out  # schedule show
    assert "1 passed" in out  # the unit test of the tasks, with no server
    assert "Traceback" not in err
