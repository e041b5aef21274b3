import pytest

from bench.stats import percentile, ratios, summary


def test_percentile_nearest_rank():
    vals = list(range(1, 101))  # 1..100
    assert percentile(vals, 50) == 50
    assert percentile(vals, 99) == 99
    assert percentile(vals, 100) == 100
    assert percentile(vals, 0) == 1
    assert percentile([3.0], 95) == 3.0
    assert percentile([5, 1, 4, 2, 3], 50) == 3


def test_percentile_empty():
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_skips_missing():
    assert summary([None, None]) is None
    assert summary([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_ratios_same_round_only():
    assert ratios([2.0, None, 9.0], [1.0, 5.0, 0]) == [2.0]
