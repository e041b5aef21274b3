"""Pure helpers behind the operator commands."""

from __future__ import annotations

from duetime.common.keys import Keyspace
from duetime.common.stats import percentile
from hypothesis import given
from hypothesis import strategies as st

from duetime.cli.common import _one_line, human_s, table
from duetime.ops.admin import replay_id


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0 and percentile(list(reversed(values)), 1) == 1.0


def test_human_durations():
    assert [human_s(x) for x in (None, 0.012, 3.44, 310, 7380, 2 * 86400)] == \
        ["-", "12ms", "3.4s", "5m10s", "2h03m", "2.0d"]
    assert human_s(-2.5) == "-2.5s"


def test_table_aligns_columns_and_marks_empty_cells():
    out = table(("ID", "STATE"), [("abc", None), ("a", "succeeded")]).splitlines()
    assert out == ["ID   STATE", "abc  -", "a    succeeded"]


def test_errors_are_flattened_to_one_line():
    assert _one_line("bad\n  thing\n\n") == "bad thing"


@given(st.text(alphabet="abcdef0123456789", min_size=1, max_size=20), st.integers(1, 64))
def test_a_replay_lives_in_the_partition_of_its_run(old: str, partitions: int):
    k = Keyspace("ns", partitions)
    for old_id in (old, f"sched-{old}@1700000000000"):
        new = replay_id(k, old_id)
        assert new != old_id and k.partition_of_run(new) == k.partition_of_run(old_id)
