"""Property tests of the command line's arguments: whatever an operator types, `duetime`
answers with its result (exit 0), or with exactly ONE line starting `error:` -- exit 2 for bad
input, having written nothing, exit 1 for a refusal (not found, ...) -- and never a
traceback.

An input that breaks this today is shown in tests/property/test_found_cli_defects.py (left out
of the strategies here until it is fixed; then put it back)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.cli import main
from duetime.embedded import EmbeddedServer

CI = settings(derandomize=True, max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
APP = "tests.apps.chaos:app"

durations = st.sampled_from(["0", "1", "10s", "500ms", "1.5s", "2m", "1h", "1h30m", "-1", "-5s",
                             "1e400", "inf", "-inf", "nan", "1e3", "", " ", "10 s", "5x", "0.0001s",
                             "99999999999999999999h", "1d", "٣s"]) | st.text(max_size=8)
instants = st.sampled_from(["2030-01-01T00:00:00+00:00", "2030-01-01T00:00:00Z",
                            "2030-01-01T00:00:00", "0001-01-01T00:00:00+00:00",
                            "9999-12-31T23:59:59+14:00", "9999-12-31T23:59:59-14:00",
                            "1969-12-31T23:59:59Z", "yesterday", ""]) | st.text(max_size=12)
jsons = st.sampled_from(["[]", "{}", "[1, 2]", '{"seconds": 0.01}', "[", "null", "1", '"x"',
                         "[1e400]", "[NaN]", '{"seconds": "x"}', '{"1": 2}']
                        ) | st.text(max_size=10)
names = st.sampled_from(["default", "q|x", "a,b", "", " ", "x" * 300, "ok-name", "日本",
                         "a\nb", "@", "sched@1"]) | st.text(max_size=10)
crons = st.sampled_from(["* * * * *", "0 3 * * *", "61 * * * *", "@daily", "", "* * *",
                         "H H * * *", "0 0 31 2 *"]) | st.text(max_size=12)
zones = st.sampled_from(["UTC", "Europe/Paris", "Mars/Base", "", "utc", "../etc/passwd"])
ints = st.sampled_from(["0", "1", "50", "-1", "100001", "x", "", "1e3", "99999999999999999999"])


def opt(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [name, v]))


def joined(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [a for p in ps for a in p])


enqueue = joined(st.just(["enqueue", "chaos.quick", "--app", APP]), opt("--args", jsons),
                 opt("--kwargs", jsons), opt("--delay", durations), opt("--at", instants),
                 opt("--key", names), opt("--queue", names))
schedule_add = joined(st.just(["schedule", "add"]), names.map(lambda n: [n]),
                      st.just(["--app", APP, "--task", "chaos.tick"]),
                      st.one_of(durations.map(lambda d: ["--every", d]),
                                st.tuples(crons, zones).map(lambda c: ["--cron", c[0], "--tz", c[1]]),
                                instants.map(lambda t: ["--at", t])),
                      opt("--lateness", durations), opt("--jitter", durations),
                      opt("--stagger", durations | st.sampled_from(["auto", "default", "AUTO"])),
                      opt("--max-catchup", ints), opt("--args", jsons))
reads = st.one_of(
    joined(st.just(["runs", "list"]), opt("--state", names), opt("--limit", ints),
           opt("--queue", names), opt("--schedule", names)),
    joined(st.just(["runs", "show"]), names.map(lambda n: [n])),
    joined(st.just(["runs", "cancel"]), names.map(lambda n: [n])),
    joined(st.just(["runs", "wait"]), names.map(lambda n: [n]), opt("--timeout", durations)),
    joined(st.just(["dead", "purge", "--yes"]), opt("--before", instants)),
    joined(st.just(["dead", "list"]), opt("--limit", ints)),
    joined(st.just(["top", "--once"]), opt("--interval", durations), opt("--window", durations)),
    joined(st.just(["schedule", "show"]), names.map(lambda n: [n])),
    joined(st.just(["schedule", "pause"]), names.map(lambda n: [n])),
    joined(st.just(["schedule", "lint"]), opt("--horizon", durations),
           opt("--max-per-second", ints), opt("--top", ints)),
    joined(st.just(["schedule", "policy", "set"]), opt("--stagger", durations)),
)


@pytest.fixture(scope="module")
def url(servers: dict[str, EmbeddedServer]) -> Iterator[str]:
    yield servers["redis"].url


def run(url: str, argv: list[str]) -> None:
    ns = f"cli{uuid.uuid4().hex[:10]}"
    res = CliRunner().invoke(main, ["--log-level", "ERROR", *argv],
                             env={"DUETIME_REDIS_URL": url, "DUETIME_NAMESPACE": ns})
    shown = f"duetime {argv!r} -> exit {res.exit_code}\nstdout: {res.stdout[-500:]}\n" \
            f"stderr: {res.stderr[-800:]}"
    assert res.exception is None or isinstance(res.exception, SystemExit), \
        f"{shown}\nraised {res.exception!r}"
    assert res.exit_code in (0, 1, 2), shown
    if res.exit_code:
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), shown
    if res.exit_code == 2:  # nothing but the namespace's first-use records (meta, T:caps)
        client = redis.Redis.from_url(url)
        written = [k for k in client.scan_iter(f"{ns}:*", count=1000)
                   if k != f"{ns}:meta".encode() and not k.endswith(b":caps")]
        client.close()
        assert not written, f"{shown}\nbad input, yet it wrote {written[:5]}"


@CI
@given(enqueue)
def test_enqueue_arguments(url: str, argv: list[str]) -> None:
    run(url, argv)


@CI
@given(schedule_add)
def test_schedule_add_arguments(url: str, argv: list[str]) -> None:
    run(url, argv)


@CI
@given(reads)
def test_operator_command_arguments(url: str, argv: list[str]) -> None:
    run(url, argv)
