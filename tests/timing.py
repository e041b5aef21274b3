"""The order `make test` runs the test files in, so the longest start first.

`make test` runs pytest on four xdist processes with `--dist loadfile`: the tests of one file
run in one process, in order (a module's cluster, venv or browser is set up once), and xdist
hands the files out in a fixed order. A long file handed out last sets the suite's wall time
while the other processes sit idle, so the files are handed out longest first (the classic
longest-processing-time-first rule), by the seconds each took in a recorded run, listed in
tests/timings.txt. A file not listed there (new, or under a few seconds) goes after them in
collection order. The timings only decide the order, never what runs: a stale list costs
minutes, not a test.

A few long files are also split by server kind (SPLIT_BY_KIND): their `[redis]`, `[valkey]`,
`[memory]` (and `[redis+replicas]`) cases are separate units, so two processes can run a
file's Redis and Valkey halves side by side. Only a file whose expensive fixtures are per kind
(a module-scoped cluster parametrised by the kind) or per test may be listed: each unit sets
up only its own kind's fixtures, so nothing is set up more often than before. Within a unit
the tests keep their order.

Refresh the list after a test got much longer or shorter: `make timings` (the suite once,
writing tests/timings.txt from the seconds each unit's tests took: setup, call, teardown).

This module is a pytest plugin registered by tests/conftest.py. It imports xdist only inside
the hook (the floors lane runs without xdist).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIMINGS = Path(__file__).with_name("timings.txt")
RECORD_ENV = "DUETIME_RECORD_TIMINGS"  # set to a path: this run writes its timings there
MIN_LISTED_S = 3.0  # units shorter than this are not worth listing: they fill the gaps

# files whose cases of each server kind are separate units (see above): each file's expensive
# fixtures are per kind (module-scoped clusters parametrised by the kind) or per test
SPLIT_BY_KIND = frozenset({
    "tests/chaos/test_chaos.py",  # per test: one chaos run of its own per kind
    "tests/integration/test_cluster.py",  # a module cluster per kind
    "tests/integration/test_concurrent_upsert.py",  # per test
    "tests/integration/test_failover.py",  # a module cluster per kind
    "tests/integration/test_reshard.py",  # a module cluster per kind
    "tests/integration/test_shard_outage.py",  # a module cluster per kind
    "tests/property/test_damaged_records.py",  # a module fleet per kind
    "tests/workloads/test_batches.py",  # per test
    "tests/workloads/test_checkpoints.py",  # per test
})
KINDS = frozenset({"redis", "valkey", "memory", "redis+replicas"})


def scope_of(nodeid: str) -> str:
    """The unit a test runs in: its file, or `file[kind]` for a file of SPLIT_BY_KIND."""
    file, _, rest = nodeid.partition("::")
    if file in SPLIT_BY_KIND and rest.endswith("]") and "[" in rest:
        params = rest[rest.index("[") + 1:-1].split("-")
        kind = next((p for p in params if p in KINDS), None)
        if kind is not None:
            return f"{file}[{kind}]"
    return file


def read_timings(path: Path = TIMINGS) -> dict[str, float]:
    """`seconds unit` per line; `#` starts a comment."""
    out: dict[str, float] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            seconds, unit = line.split(None, 1)
            out[unit] = float(seconds)
    return out


@pytest.hookimpl(trylast=True)  # after pytest's own reordering for higher-scoped fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (whose collection order is the order xdist hands units out in):
    the units longest first. A stable sort: each unit's tests keep their order."""
    if not hasattr(config, "workerinput"):
        return
    seconds = read_timings()
    items.sort(key=lambda item: -seconds.get(scope_of(item.nodeid), 0.0))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent in the floors lane
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the units of scope_of, handed out in collection order (xdist's
    default would sort them by their number of tests: the long files, which have few, last)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (the worker and
    scheduler processes a test starts and stops; servers a module started, once it stops
    them: a session's own servers are counted by no unit)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class CpuMeter:
    """On the process that runs the tests (an xdist worker, or pytest alone): each test
    phase's CPU seconds (`_cpu_s`), carried to the Recorder in the report's user_properties.
    Wall seconds say which unit to start first; CPU seconds say which cost the two cores."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Iterator[None]:
        outcome = yield
        report = outcome.get_result()
        start = getattr(item, "_duetime_cpu_at", None)
        now = _cpu_s()
        if start is not None:
            report.user_properties.append(("cpu_s", now - start))
        item._duetime_cpu_at = now  # type: ignore[attr-defined]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        item._duetime_cpu_at = _cpu_s()  # type: ignore[attr-defined]


class Recorder:
    """With DUETIME_RECORD_TIMINGS=path: each unit's seconds (setup + call + teardown of its
    tests), and its CPU seconds (CpuMeter), written at the end of the run in the format of
    tests/timings.txt (the CPU as a comment)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        unit = scope_of(report.nodeid)
        self.seconds[unit] = self.seconds.get(unit, 0.0) + report.duration
        cpu = sum(v for k, v in report.user_properties if k == "cpu_s")
        self.cpu[unit] = self.cpu.get(unit, 0.0) + cpu

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        listed = sorted(((s, u) for u, s in self.seconds.items() if s >= MIN_LISTED_S), reverse=True)
        total, cpu = sum(self.seconds.values()), sum(self.cpu.values())
        lines = [
            "# Seconds each unit of the suite took in one recorded run (setup + call + teardown",
            "# of its tests; a unit is a file, or file[kind] for the files tests/timing.py splits",
            "# by server kind). `make test` hands the listed units out longest first; the rest",
            f"# (under {MIN_LISTED_S:g} s) follow in collection order. Written by `make timings`.",
            "# After `#`: the CPU seconds the unit's tests used (pytest's process and the",
            "# processes its tests started and waited for).",
            f"# That run: {len(self.seconds)} units, {total:.0f} s of test time in all, {cpu:.0f} s of CPU.",
            *(f"{s:6.1f} {u}  # cpu {self.cpu.get(u, 0.0):.1f}" for s, u in listed),
        ]
        self.path.write_text("\n".join(lines) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    record = os.environ.get(RECORD_ENV)
    if not record:
        return
    config.pluginmanager.register(CpuMeter(), "duetime-cpu-meter")
    if not hasattr(config, "workerinput"):  # the controller sees every report
        config.pluginmanager.register(Recorder(Path(record)), "duetime-timings-recorder")
