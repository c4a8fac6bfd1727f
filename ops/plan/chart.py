"""The PR preview's cost-and-capacity chart, where the node table is longer than a screen.

GitHub renders a ```mermaid block in a comment as a diagram (github/roadmap#372, shipped
2022); Mermaid's `xychart-beta` draws bars (mermaid.js.org/syntax/xyChart.html; that
GitHub's Mermaid has it is unconfirmed here: where not, the block shows as text). Inline
SVG or an image data URI would be stripped from a comment, and a hosted image would need
a server: a Mermaid block needs neither, and reads as plain text where it is not drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from model.catalog import HOURS_PER_MONTH

# A node table of more rows than this does not fit one screen of a PR comment.
SCREEN_ROWS = 25


def cost_chart(plan: Mapping[str, Any], accelerators: Mapping[str, str]) -> str | None:
    """A bar chart of USD/month by accelerator type (`accelerators`: node name -> type),
    its node and chip counts in the labels; None when the node table fits a screen or
    nothing is priced."""
    nodes = plan.get("cost", {}).get("nodes", [])
    if len(nodes) <= SCREEN_ROWS:
        return None
    groups: dict[str, list[float]] = {}  # type -> [nodes, chips, usd per month]
    for node in nodes:
        group = groups.setdefault(accelerators.get(node["name"], "?"), [0, 0, 0.0])
        group[0] += 1
        group[1] += int(node.get("chips") or 0)
        group[2] += float(node.get("usdPerHour") or 0.0) * HOURS_PER_MONTH
    if not any(usd for _, _, usd in groups.values()):
        return None
    order = sorted(groups, key=lambda name: -groups[name][2])
    labels = ", ".join(f'"{name} ({int(groups[name][0])} nodes, {int(groups[name][1])} chips)"'
                       for name in order)
    bars = ", ".join(f"{groups[name][2]:.0f}" for name in order)
    return "\n".join(["```mermaid", "xychart-beta",
                      '    title "USD/month at list prices by accelerator type"',
                      f"    x-axis [{labels}]", '    y-axis "USD/month"', f"    bar [{bars}]",
                      "```"])
