"""Time conversions of the run model."""

from datetime import UTC, datetime, timedelta

import pytest
from duetime.common.models import from_ms, to_ms


def test_due_times_round_up_so_a_run_is_never_due_early():
    t = datetime(2026, 3, 8, 7, 30, tzinfo=UTC) + timedelta(microseconds=400)
    assert to_ms(t) == to_ms(t.replace(microsecond=0))
    assert to_ms(t, ceil=True) == to_ms(t.replace(microsecond=0)) + 1
    whole = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
    assert to_ms(whole, ceil=True) == to_ms(whole)
    assert from_ms(to_ms(whole)) == whole


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="naive"):
        to_ms(datetime(2026, 1, 1))
