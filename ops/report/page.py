"""One self-contained HTML page of a stack's node histories: inline SVG charts, inline
CSS, and a few lines of inline script that check the charts were drawn. Nothing is
fetched: no network, no CDN, no external file, so it opens offline and as an attachment.

The script records any error into the page (`#errors`, `data-errors`) and, once the
page has loaded, sets `data-plots-drawn` on <body> to the number of charts whose line
the browser laid out with a length and a box (tests/ops/test_report.py reads both from
headless Chromium's DOM).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ops.report.history import NodeHistory, Series, agent_goodput

WIDTH, HEIGHT = 560, 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 40
TICKS = 5

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2430; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 32px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.plot { background: #fafbfc; border: 1px solid #dde1e6; }
svg.plot .line { fill: none; stroke: #1f6feb; stroke-width: 2; }
svg.plot .axis { stroke: #8c959f; stroke-width: 1; }
svg.plot .grid { stroke: #eaeef2; stroke-width: 1; }
svg.plot .save { fill: #2da44e; } svg.plot .restart { stroke: #cf222e; stroke-dasharray: 4 3; }
svg.plot text { font-size: 11px; fill: #57606a; }
svg.plot .title { font-size: 13px; fill: #1d2430; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #dde1e6; padding: 3px 8px; text-align: left; }
#errors { color: #cf222e; }
"""

# Records errors, then counts the charts the browser drew (a line with length and a box).
SCRIPT = """
(function () {
  var errors = [];
  function note(text) {
    errors.push(text);
    document.body.dataset.errors = String(errors.length);
    document.getElementById('errors').textContent = errors.join('\\n');
  }
  window.addEventListener('error', function (event) { note('error: ' + event.message); });
  window.addEventListener('unhandledrejection', function (event) {
    note('unhandled rejection: ' + event.reason);
  });
  window.addEventListener('load', function () {
    var drawn = 0;
    document.querySelectorAll('svg.plot path.line').forEach(function (line) {
      var box = line.getBBox();
      if (line.getTotalLength() > 0 && (box.width > 0 || box.height > 0)) { drawn += 1; }
    });
    document.body.dataset.plotsDrawn = String(drawn);
    document.body.dataset.errors = String(errors.length);
  });
})();
"""


@dataclass(frozen=True)
class Scale:
    """Maps data (lo..hi) onto pixels (start..end)."""

    lo: float
    hi: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        return self.start + (value - self.lo) / (self.hi - self.lo) * (self.end - self.start)


def nice_ticks(lo: float, hi: float, count: int = TICKS) -> list[float]:
    """About `count` round values from lo to hi (steps of 1, 2 or 5 times a power of 10)."""
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def bounds(values: Sequence[float], *, floor_zero: bool = False) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if floor_zero:
        lo = min(lo, 0.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    return lo, hi


def label(value: float) -> str:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-2):
        return f"{value:.2g}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def chart(series: Series, title: str, *, x_max: float = 0.0,
          saves: Sequence[tuple[float, int]] = (), restarts: Sequence[float] = (),
          empty: str = "no data") -> str:
    """An SVG line chart of `series` over the job's seconds (0 to at least `x_max`: a
    node's charts share their time axis)."""
    head = (f'<svg class="plot" data-series="{series.name}" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">'
            f'<text class="title" x="{MARGIN_LEFT}" y="18">{html.escape(title)}</text>')
    points = series.points
    if not points:
        return (f'{head}<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" '
                f'text-anchor="middle">{html.escape(empty)}</text></svg>')
    x_lo, x_hi = bounds([0.0, x_max, *(x for x, _ in points)], floor_zero=True)
    y_lo, y_hi = bounds([y for _, y in points], floor_zero=series.name in ("step", "spend"))
    x = Scale(x_lo, x_hi, MARGIN_LEFT, WIDTH - MARGIN_RIGHT)
    y = Scale(y_lo, y_hi, HEIGHT - MARGIN_BOTTOM, MARGIN_TOP)
    parts = [head, *_axes(x, y, series.unit)]
    parts += [f'<line class="restart" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{MARGIN_TOP}" '
              f'y2="{HEIGHT - MARGIN_BOTTOM}"><title>restart at {t:.1f} s</title></line>'
              for t in restarts]
    path = " ".join(f"{'M' if i == 0 else 'L'}{x(px):.1f},{y(py):.1f}"
                    for i, (px, py) in enumerate(points))
    if len(points) == 1:  # one point: a short flat stroke, so it shows
        px, py = x(points[0][0]), y(points[0][1])
        path = f"M{px - 3:.1f},{py:.1f} L{px + 3:.1f},{py:.1f}"
    parts.append(f'<path class="line" data-points="{len(points)}" d="{path}"/>')
    by_time = dict(points)
    parts += [f'<circle class="save" cx="{x(t):.1f}" cy="{y(by_time.get(t, step)):.1f}" r="3.5">'
              f'<title>checkpoint saved at step {step} ({t:.1f} s)</title></circle>'
              for t, step in saves]
    parts.append("</svg>")
    return "".join(parts)


def _axes(x: Scale, y: Scale, unit: str) -> list[str]:
    bottom, left = HEIGHT - MARGIN_BOTTOM, MARGIN_LEFT
    parts = []
    for value in nice_ticks(y.lo, y.hi):
        parts.append(f'<line class="grid" x1="{left}" x2="{WIDTH - MARGIN_RIGHT}" '
                     f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
                     f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f'{label(value)}</text>')
    for value in nice_ticks(x.lo, x.hi):
        parts.append(f'<text x="{x(value):.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f'{label(value)}</text>')
    parts.append(f'<line class="axis" x1="{left}" x2="{WIDTH - MARGIN_RIGHT}" y1="{bottom}" '
                 f'y2="{bottom}"/><line class="axis" x1="{left}" x2="{left}" y1="{MARGIN_TOP}" '
                 f'y2="{bottom}"/>')
    parts.append(f'<text x="{(left + WIDTH - MARGIN_RIGHT) / 2}" y="{HEIGHT - 6}" '
                 f'text-anchor="middle">job seconds</text>'
                 f'<text x="12" y="{(MARGIN_TOP + bottom) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {(MARGIN_TOP + bottom) / 2})">{html.escape(unit)}'
                 f'</text>')
    return parts


def node_section(history: NodeHistory) -> str:
    status, goodput = history.status, agent_goodput(history)
    price = ("no list price" if history.hourly_usd is None
             else f"${history.hourly_usd:,.2f}/h ({'spot' if history.spot else 'on-demand'})")
    rows = [("state", status.get("state", "")), ("step", status.get("step", "")),
            ("type", f"{history.accelerator_type}, {price}"),
            ("goodput (agent, every category)",
             f"{goodput['percent']}%" if isinstance(goodput.get("percent"), (int, float))
             else ""),
            ("goodput seconds", ", ".join(f"{k} {v}" for k, v in goodput.items()
                                          if k not in ("percent", "job", "total"))),
            ("checkpoints kept", ", ".join(map(str, history.checkpoints)) or "none"),
            ("checkpoints saved", ", ".join(str(step) for _, step in history.saves) or "none"),
            ("restarts", str(len(history.restarts)))]
    table = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(str(value))}</td></tr>"
                    for name, value in rows)
    no_price = f"no list price for {history.accelerator_type}"
    x_max = max((series.points[-1][0] for series in history.series() if series.points),
                default=0.0)
    marks = {"x_max": x_max, "restarts": history.restarts}
    charts = [chart(history.step, "step", saves=history.saves, **marks),
              chart(history.loss, "loss", **marks),
              chart(history.goodput, "goodput so far (the job's own accounting), %", **marks),
              chart(history.spend, "spend at list price, USD", empty=no_price, **marks)]
    return (f'<section class="node" data-node="{html.escape(history.node)}">'
            f"<h2>{html.escape(history.node)}</h2><table>{table}</table>"
            f'<div class="charts">{"".join(charts)}</div></section>')


def render(stack: str, source: str, histories: Sequence[NodeHistory],
           now: datetime | None = None) -> str:
    """The whole page."""
    made = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    sections = "".join(node_section(history) for history in histories)
    expected = sum(1 for history in histories for series in history.series() if series.points)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>tpu-stack report: {html.escape(stack)}</title><style>{STYLE}</style>"
            f'</head><body data-plots-expected="{expected}" data-plots-drawn="0" '
            f'data-errors="0"><h1>tpu-stack report: stack {html.escape(stack)}</h1>'
            f"<p>From {html.escape(source)}, made {made}. Time is the job's own: seconds of "
            f"its processes one after the other, from its goodput lines; restarts are dashed "
            f"red lines, checkpoint saves green dots. Spend is the node's list price over "
            f"those seconds; the agent's own seconds (boot, installs, between restarts) are in "
            f"the goodput totals above each node's charts.</p>{sections}"
            f'<pre id="errors"></pre><script>{SCRIPT}</script></body></html>\n')
