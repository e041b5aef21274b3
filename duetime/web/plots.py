"""Small time-series plots as inline SVG: drawn on the server, no chart library, no script."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 160, 36, 2


def _fmt(v: float) -> str:
    return f"{v:.3g}" if isinstance(v, float) and not v.is_integer() else f"{int(v)}"


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

    runs: list[list[str]] = [[]]
    for t, v in points:
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(xy(t, v))
    lines = "".join(f'<polyline points="{" ".join(r)}"/>' if len(r) > 1 else
                    f'<circle r="1.5" cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}"/>'
                    for r in runs if r)
    last = values[-1]
    title = f"{label}: now {_fmt(last)}{unit}, max {_fmt(top)}{unit}, min {_fmt(min(values))}{unit}"
    return Markup(f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
                  f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
                  f'{lines}</svg>')
