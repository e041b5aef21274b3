"""Every time duetime shows to a person or writes as text: one formatter per kind of fact.

- :func:`iso` — an instant as ISO-8601 UTC with ``Z`` (lossless: fractional digits only when
  the instant has them). The ``--json`` output, stored trigger fields and the text tables all
  use it, so one instant reads the same everywhere.
- :func:`iso_local` — the same instant on a zone's wall clock, with its offset.
- :func:`format_duration` — a duration in the syntax duetime parses back (``1h30m``, ``500ms``).
- :func:`human_duration` — a measured amount of time for tables (``12ms``, ``3.4s``, ``5m10s``).
- :func:`relative` — an instant relative to now in words (``in 3 minutes``, ``2 hours ago``),
  from pendulum, for listings where "when" matters more than the exact second.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

__all__ = ["ago", "format_duration", "human_duration", "iso", "iso_local", "relative"]

_US = timedelta(microseconds=1)
_UNITS = (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000),
          ("ms", 1_000))


def _timespec(dt: datetime, compact: bool) -> str:
    if not compact:
        return "auto"
    return "milliseconds" if dt.microsecond else "seconds"


def iso(dt: datetime | None, *, compact: bool = False) -> str | None:
    """``2026-03-08T07:30:00Z`` (``.123000`` only when there is a fraction; ``compact``, for
    text, writes it to the millisecond: ``.123``). None stays None (null in JSON)."""
    if dt is None:
        return None
    return dt.astimezone(UTC).isoformat(timespec=_timespec(dt, compact)).replace("+00:00", "Z")


def iso_local(dt: datetime, zone: tzinfo, *, compact: bool = False) -> str:
    """The instant on the zone's wall clock with its UTC offset: ``2026-03-08T03:30:00-04:00``."""
    return dt.astimezone(zone).isoformat(timespec=_timespec(dt, compact))


def format_duration(d: timedelta) -> str:
    """Largest unit first, each once: ``1h30m``, ``2d``, ``1500us`` (lossless, so it parses
    back to the same duration except for the ``us`` form, which only shows sub-ms values)."""
    us = d // _US
    if us < 0:
        return "-" + format_duration(-d)
    if us % 1000:
        return f"{us}us"
    parts = []
    for unit, size in _UNITS:
        n, us = divmod(us, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def human_duration(seconds: float | None) -> str:
    """12ms, 3.4s, 5m10s, 2h03m, 4.0d: short and unambiguous in a table ('-' for unknown)."""
    if seconds is None:
        return "-"
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s < 1:
        return f"{sign}{s * 1000:.0f}ms"
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{s / 86400:.1f}d"


def ago(seconds: float | None) -> str:
    """An age measured to the second, for liveness columns: ``4.2s ago`` ('-' for unknown)."""
    return "-" if seconds is None else f"{human_duration(seconds)} ago"


def relative(when: datetime | None, now: datetime) -> str:
    """``in 3 minutes`` / ``2 hours ago`` / ``a few seconds ago``, measured from ``now`` (the
    server's clock, which decides when things run, not this machine's). '-' for no time."""
    if when is None:
        return "-"
    import pendulum  # imported here: 30 ms, paid only by commands that print times
    from pendulum.helpers import format_diff

    diff = pendulum.instance(when.astimezone(UTC)).diff(pendulum.instance(now.astimezone(UTC)))
    return format_diff(diff, is_now=True, locale="en")
