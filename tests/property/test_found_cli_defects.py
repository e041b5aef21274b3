"""CLI arguments the property tests of tests/property/test_cli_args.py found to end in a
traceback instead of one `error:` line (exit 2). The argument parsing (duetime/cli_common.py)
is being rewritten elsewhere, so they are shown here, failing on purpose, for that rewrite to
fix; each is the smallest input hypothesis found."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from duetime.cli import main
from duetime.embedded import EmbeddedServer

APP = "tests.apps.chaos:app"


@pytest.mark.parametrize("argv", [
    # parse_seconds reads '1e400' as float infinity; the enqueue then overflows
    ["enqueue", "chaos.quick", "--app", APP, "--delay", "1e400"],
    ["enqueue", "chaos.quick", "--app", APP, "--delay", "nan"],
    # parse_payload lets json.loads recurse until RecursionError
    ["enqueue", "chaos.quick", "--app", APP, "--args", "[" * 3000],
    # an instant whose UTC form lies past year 9999 overflows in the trigger
    ["schedule", "add", "s", "--app", APP, "--task", "chaos.tick", "--at",
     "9999-12-31T23:59:59-14:00"],
], ids=["delay-1e400", "delay-nan", "args-deeply-nested", "at-past-9999-utc"])
def test_bad_input_is_one_error_line_not_a_traceback(servers: dict[str, EmbeddedServer],
                                                     namespace: str, argv: list[str]) -> None:
    res = CliRunner().invoke(main, ["--log-level", "ERROR", *argv],
                             env={"DUETIME_REDIS_URL": servers["redis"].url,
                                  "DUETIME_NAMESPACE": namespace})
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
