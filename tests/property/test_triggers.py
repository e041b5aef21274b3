"""Property tests of the trigger parsers (common/time/spec.py, common/schedules.py): any text
is a trigger or one `InvalidSchedule`; a trigger never skips, repeats or goes back; and what
the evaluator reads back from a schedule record is the trigger that was stored -- or, for a
record damaged by hand, a `ValueError` the evaluator turns into a quarantine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import available_timezones

from duetime.common.schedules import TRIGGER_FIELDS, trigger_fields, trigger_from_fields
from duetime.common.time.spec import At, Cron, Every, InvalidSchedule, Trigger, trigger_from_dict
from hypothesis import given, settings
from hypothesis import strategies as st

CI = settings(derandomize=True, max_examples=120, deadline=None)
ZONES = sorted(z for z in available_timezones() if "/" in z and not z.startswith(("Etc", "SystemV")))

instants = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1),
                        timezones=st.just(UTC))
zones = st.sampled_from(["UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe",
                         "Asia/Kathmandu", "America/St_Johns", "Pacific/Chatham"]) | st.sampled_from(ZONES)

# cron fields built from the grammar (values, ranges, steps, lists, names, H) plus junk
atoms = st.sampled_from(["*", "H", "0", "1", "5", "7", "12", "15", "23", "29", "30", "31", "59",
                         "60", "MON", "fri", "JAN", "dec", "SUN", "H(0-29)", "?", "L", "-1", ""])


@st.composite
def field(draw: st.DrawFn) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        a = draw(atoms)
        if draw(st.booleans()):
            a = f"{a}-{draw(atoms)}"
        if draw(st.integers(0, 3)) == 0:
            a = f"{a}/{draw(st.sampled_from(['1', '2', '5', '0', '15', 'x']))}"
        items.append(a)
    return ",".join(items)


cron_text = (st.lists(field(), min_size=5, max_size=5).map(" ".join)
             | st.lists(field(), min_size=0, max_size=7).map(" ".join)
             | st.sampled_from(["@daily", "@hourly", "@weekly", "@yearly", "@every", "@daily 1"])
             | st.text(max_size=30))


@st.composite
def valid_field(draw: st.DrawFn, lo: int, hi: int, names: tuple[str, ...] = ()) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "range", "star", "hash", "name"]))
        a, b = sorted((draw(st.integers(lo, hi)), draw(st.integers(lo, hi))))
        step = draw(st.sampled_from(["", "", f"/{draw(st.integers(1, hi - lo + 1))}"]))
        if kind == "value":
            items.append(str(a))
        elif kind == "range":
            items.append(f"{a}-{b}{step}")
        elif kind == "star":
            items.append(f"*{step}")
        elif kind == "hash":
            items.append(draw(st.sampled_from(["H", f"H({a}-{b})"])) + step)
        else:
            items.append(draw(st.sampled_from(names)) if names else str(a))
    return ",".join(items)


MONTHS = ("JAN", "feb", "Mar", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "mon", "Tue", "WED", "THU", "FRI", "SAT")
valid_cron = st.tuples(valid_field(0, 59), valid_field(0, 23), valid_field(1, 31),
                       valid_field(1, 12, MONTHS), valid_field(0, 7, DAYS)).map(" ".join)


def cron_or_refused(expr: str, tz: str) -> Cron | None:
    try:
        return Cron(expr, tz=tz, seed="s")
    except InvalidSchedule:
        return None


@CI
@given(cron_text, zones)
def test_any_cron_text_is_a_trigger_or_one_invalid_schedule(expr: str, tz: str) -> None:
    cron_or_refused(expr, tz)


def check_chain(trig: Trigger, t: datetime, steps: int = 6) -> None:
    """Each next_after is strictly later, and nothing lies between two occurrences."""
    prev = t
    for _ in range(steps):
        nxt = trig.next_after(prev)
        if nxt is None:
            return
        assert nxt > prev and nxt.tzinfo is not None
        mid = prev + (nxt - prev) / 2
        assert trig.next_after(mid) == nxt, (prev, mid, nxt)  # none skipped between
        prev = nxt


@CI
@given(valid_cron | cron_text, zones, instants)
def test_a_cron_never_skips_repeats_or_goes_back(expr: str, tz: str, t: datetime) -> None:
    trig = cron_or_refused(expr, tz)
    if trig is None:
        return  # refused: the first test covers that
    check_chain(trig, t)
    nxt = trig.next_after(t)
    if nxt is not None:
        assert nxt.second == 0 and nxt.microsecond == 0  # whole minutes (modern zones)


intervals = st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(days=400))


@CI
@given(intervals, instants, instants)
def test_every_fires_on_its_anchor_grid_within_one_interval(interval: timedelta,
                                                            anchor: datetime, t: datetime) -> None:
    trig = Every(interval, anchor)
    nxt = trig.next_after(t)
    assert nxt is not None and t < nxt <= t + interval
    assert (nxt - anchor) % interval == timedelta(0)
    check_chain(trig, t, 3)


def triggers() -> st.SearchStrategy[Trigger]:
    crons = st.builds(cron_or_refused, valid_cron, zones).filter(lambda c: c is not None)
    return (crons | st.builds(Every, intervals, instants) | st.builds(At, instants))  # type: ignore[return-value]


@CI
@given(triggers())
def test_a_stored_trigger_reads_back_as_itself(trig: Trigger) -> None:
    assert trigger_from_dict(trig.to_dict()) == trig
    fields = {k: (str(v).encode()) for k, v in trigger_fields(trig).items()}
    assert trigger_from_fields([fields.get(f) for f in TRIGGER_FIELDS]) == trig


junk = st.none() | st.binary(max_size=12) | st.sampled_from(
    [b"", b"cron", b"every", b"at", b"0", b"-5", b"99999999999999999999999", b"* * * * *",
     b"Mars/Olympus", b"1970-01-01T00:00:00+00:00", b"\xff\xfe", b"nan"])


@CI
@given(triggers(), st.dictionaries(st.sampled_from(TRIGGER_FIELDS), junk, min_size=1, max_size=4))
def test_a_damaged_trigger_record_reads_as_a_trigger_or_a_value_error(
        trig: Trigger, damage: dict[str, bytes | None]) -> None:
    """The evaluator quarantines a schedule whose trigger fields raise; anything else than a
    ValueError (InvalidSchedule is one) would escape as a crash of its own."""
    fields = {k: str(v).encode() for k, v in trigger_fields(trig).items()}
    fields.update(damage)
    try:
        back = trigger_from_fields([fields.get(f) for f in TRIGGER_FIELDS])
    except ValueError:
        return
    assert isinstance(back, Trigger)
    back.next_after(datetime(2030, 1, 1, tzinfo=UTC))  # and it can be evaluated
