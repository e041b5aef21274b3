"""Small time-series plots as inline SVG: drawn on the server, no chart library, no script."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 160, 36, 2


def _fmt(v: float) -> str:
    return f"{v:.3g}" if isinstance(v, float) and not v.is_integer() else f"{int(v)}"


def _lines(points: Sequence[tuple[int, float | None]],
           xy: Callable[[int, float], str]) -> list[str]:
    """The series as SVG: a polyline per run of points between gaps (a missing point breaks
    the line), a dot for a lone point. `xy` places a point ('x,y' in the plot's pixels)."""
    runs: list[list[str]] = [[]]
    for t, v in points:
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(xy(t, v))
    return [f'<polyline points="{" ".join(r)}"/>' if len(r) > 1 else
            f'<circle r="1.5" cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}"/>'
            for r in runs if r]


def sparkline(points: Sequence[tuple[int, float | None]], t0: int, t1: int, label: str,
              unit: str = "") -> Markup:
    """A line over [t0, t1] (ms) scaled to the largest value; a gap where a point is missing.
    The title (a tooltip) gives the last value and the range."""
    values = [v for _, v in points if v is not None]
    if not values or t1 <= t0:
        return Markup(f'<svg class="spark empty" width="{WIDTH}" height="{HEIGHT}" role="img" '
                      f'aria-label="{escape(label)}: no samples"><title>{escape(label)}: no samples'
                      '</title></svg>')
    top = max(values) or 1.0
    span = t1 - t0

    def xy(t: int, v: float) -> str:
        x = PAD + (t - t0) / span * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - v / top * (HEIGHT - 2 * PAD)
        return f"{x:.1f},{y:.1f}"

    lines = "".join(_lines(points, xy))
    last = values[-1]
    title = f"{label}: now {_fmt(last)}{unit}, max {_fmt(top)}{unit}, min {_fmt(min(values))}{unit}"
    return Markup(f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
                  f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
                  f'{lines}</svg>')


CW, CH = 420, 130  # a chart with axes: its size, and the plot area's margins
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 10, 34
TICK_STEPS_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
MAX_X_TICKS = 6


def _utc_hhmm(t_ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t_ms / 1000, UTC).strftime("%H:%M")


def time_ticks(t0: int, t1: int) -> list[int]:
    """Instants (ms) on round minutes or hours inside [t0, t1], at most MAX_X_TICKS of them."""
    span_s = (t1 - t0) / 1000
    step = next((s for s in TICK_STEPS_S if span_s / s <= MAX_X_TICKS), TICK_STEPS_S[-1]) * 1000
    first = -(-t0 // step) * step
    return list(range(first, t1 + 1, step))


def chart(points: Sequence[tuple[int, float | None]], t0: int, t1: int, title: str,
          y_label: str) -> Markup:
    """A line chart over [t0, t1] (ms) with its axes: time (UTC, HH:MM ticks) along x, the
    value from 0 to the largest one along y, each axis labelled (`y_label` names the unit)."""
    values = [v for _, v in points if v is not None]
    top = max(values, default=0.0) or 1.0
    span = max(t1 - t0, 1)
    pw, ph = CW - LEFT - RIGHT, CH - TOP - BOTTOM

    def x(t: int) -> float:
        return LEFT + (t - t0) / span * pw

    def y(v: float) -> float:
        return TOP + ph - v / top * ph

    parts = [f'<line class="axis" x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}"/>',
             f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}"/>']
    for tick in (0.0, top / 2, top):
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y(tick):.1f}" x2="{LEFT + pw}" '
                     f'y2="{y(tick):.1f}"/>'
                     f'<text class="ytick" x="{LEFT - 4}" y="{y(tick) + 3:.1f}" text-anchor="end">'
                     f'{_fmt(tick)}</text>')
    for t in time_ticks(t0, t1):
        parts.append(f'<line class="axis" x1="{x(t):.1f}" y1="{TOP + ph}" x2="{x(t):.1f}" '
                     f'y2="{TOP + ph + 4}"/><text class="xtick" x="{x(t):.1f}" y="{TOP + ph + 14}" '
                     f'text-anchor="middle">{_utc_hhmm(t)}</text>')
    parts.append(f'<text class="xlabel" x="{LEFT + pw / 2:.0f}" y="{CH - 3}" text-anchor="middle">'
                 f'time (UTC)</text>')
    parts.append(f'<text class="ylabel" transform="translate(11 {TOP + ph / 2:.0f}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_label)}</text>')
    parts += _lines(points, lambda t, v: f"{x(t):.1f},{y(v):.1f}")
    label = f"{title}: {y_label} over time" + ("" if values else " (no samples)")
    return Markup(f'<svg class="chart" width="{CW}" height="{CH}" viewBox="0 0 {CW} {CH}" '
                  f'role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>'
                  f'{"".join(parts)}</svg>')
