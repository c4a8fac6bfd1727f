"""The PR preview's cost-and-capacity chart: a Mermaid bar chart where the node table is
longer than a screen (ops/plan/chart.py)."""

from __future__ import annotations

from ops.plan.chart import SCREEN_ROWS
from ops.plan.diff import diff_plans, render_diff
from ops.plan.report import render


def big_plan(make_plan, node, count: int) -> dict:
    nodes = {f"n{i}": node("v5litepod-8" if i % 3 else "v6e-4", spot=True) for i in range(count)}
    prices = {name: 4.0 if inputs["acceleratorType"] == "v5litepod-8" else 10.0
              for name, inputs in nodes.items()}
    plan = make_plan(nodes, usd_per_hour=prices)
    for cost in plan["cost"]["nodes"]:
        cost["chips"] = 8 if prices[cost["name"]] == 4.0 else 4
    return plan


def test_a_node_table_longer_than_a_screen_gets_the_chart(make_plan, node):
    text = render(big_plan(make_plan, node, 30), "markdown")
    # 20 v5litepod-8 at $4/h and 10 v6e-4 at $10/h, 730 h a month
    assert ("```mermaid\nxychart-beta\n"
            '    title "USD/month at list prices by accelerator type"\n'
            '    x-axis ["v6e-4 (10 nodes, 40 chips)", "v5litepod-8 (20 nodes, 160 chips)"]\n'
            '    y-axis "USD/month"\n    bar [73000, 58400]\n```') in text  # largest first
    assert text.index("```mermaid") > text.index("| n29 |")  # after the node table


def test_a_table_that_fits_a_screen_and_the_terminal_get_none(make_plan, node):
    assert "```mermaid" not in render(big_plan(make_plan, node, SCREEN_ROWS), "markdown")
    assert "xychart" not in render(big_plan(make_plan, node, 30), "table")


def test_the_pr_comment_s_diff_shows_the_head_s_chart(make_plan, node):
    head = big_plan(make_plan, node, 30)
    comment = render_diff(diff_plans(make_plan(), head), "markdown")
    assert '    bar [73000, 58400]\n```' in comment
    assert comment.index("```mermaid") < comment.index("```diff")  # before the steps
    assert "```mermaid" not in render_diff(diff_plans(make_plan(), make_plan()), "markdown")
