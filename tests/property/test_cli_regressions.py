"""CLI arguments the property tests of tests/property/test_cli_args.py found to end in a
traceback instead of one `error:` line (exit 2), kept as regression tests: deeply nested JSON
(the payload parser bounds the depth), `--delay 1e400`, `--delay nan` and an `--at` past year
9999 in UTC (the bounded duration/instant parser)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from duetime.cli import main
from duetime.embedded import EmbeddedServer

APP = "tests.apps.chaos:app"


@pytest.mark.parametrize("argv", [
    # parse_payload lets json.loads recurse until RecursionError (--args and --kwargs alike)
    ["enqueue", "chaos.quick", "--app", APP, "--args", "[" * 3000],
    ["schedule", "add", "s", "--app", APP, "--task", "chaos.tick", "--every", "1h",
     "--kwargs", "[" * 3000],
], ids=["enqueue-args-deeply-nested", "schedule-kwargs-deeply-nested"])
def test_bad_input_is_one_error_line_not_a_traceback(servers: dict[str, EmbeddedServer],
                                                     namespace: str, argv: list[str]) -> None:
    res = CliRunner().invoke(main, ["--log-level", "ERROR", *argv],
                             env={"DUETIME_REDIS_URL": servers["redis"].url,
                                  "DUETIME_NAMESPACE": namespace})
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
