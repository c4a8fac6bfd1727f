"""The spend meter (issue 36): a plan's figure is its nodes' hourly catalog prices times
hours; a team's month by its nodes' create times; when its budget runs out; goodput's
lost time in USD; the `tpuctl status --team` line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from components.stack_config import file_config
from model import catalog, meter, spend
from model.fleet import StackTarget
from model.settings.load import load_settings
from ops.tpu.api import NodeStatus
from ops.tpu.status import lost_usd, node_lost_usd, spend_of
from ops.tpu.status_views import COLUMNS, spend_line, status_rows, status_table

NOW = datetime(2026, 12, 10, 20, 0, tzinfo=timezone.utc)


def test_a_plans_meter_is_the_sum_of_its_nodes_hourly_catalog_prices_times_hours() -> None:
    settings = load_settings(file_config("platform"), "platform")
    nodes = [node for _, node in settings.all_nodes]
    assert len(nodes) >= 2
    expected = sum(catalog.usd_per_hour(node.tpu, spot=node.spot) or 0.0 for node in nodes) * 10
    assert expected > 0
    assert meter.plan_meter_usd(nodes, hours=10) == pytest.approx(expected)
    # The figures themselves: v5e spot is 0.607 USD a chip-hour in the catalog.
    v5e = next(node for node in nodes if node.tpu.generation.name == "v5e" and node.spot)
    assert meter.node_hourly_usd(v5e) == pytest.approx(0.607 * v5e.tpu.chips)


def test_a_teams_month_counts_each_node_from_its_creation_or_the_months_start() -> None:
    start = meter.month_start(NOW)
    assert start == datetime(2026, 12, 1, 8, tzinfo=timezone.utc)  # midnight Pacific
    assert meter.month_start(datetime(2026, 12, 1, 7, tzinfo=timezone.utc)) == datetime(
        2026, 11, 1, 8, tzinfo=timezone.utc)
    old = spend.MeteredNode("old", "v4-16", False, start - timedelta(days=3))
    new = spend.MeteredNode("new", "v5litepod-8", True, NOW - timedelta(hours=5))
    got = meter.team_spend("nlp", [old, new], budget_usd=10_000, now=NOW)
    v4 = catalog.usd_per_hour(catalog.parse_accelerator_type("v4-16"), spot=False)
    v5e = catalog.usd_per_hour(catalog.parse_accelerator_type("v5litepod-8"), spot=True)
    assert v4 is not None and v5e is not None
    hours_old = (NOW - start).total_seconds() / 3600
    assert got.spent_usd == pytest.approx(v4 * hours_old + v5e * 5)
    assert got.burn_usd_per_hour == pytest.approx(v4 + v5e)
    assert got.hours_left == pytest.approx((10_000 - got.spent_usd) / (v4 + v5e))
    assert meter.team_spend("nlp", [old], budget_usd=100, now=NOW).hours_left == 0


def node(node_id: str, accelerator_type: str, state: str, hours: float,
         goodput: str = "") -> NodeStatus:
    return NodeStatus(zone="us-central2-b", node_id=node_id, state=state, health="",
                      accelerator_type=accelerator_type, runtime_version="", spot=False,
                      labels={"team": "nlp"}, metadata={}, queued_resource="",
                      created=NOW - timedelta(hours=hours), project="acme-nlp",
                      job={"goodput": goodput} if goodput else {})


def test_status_team_shows_spend_burn_when_the_budget_runs_out_and_lost_goodput() -> None:
    target = StackTarget(project="acme", stack="platform", nodes=(), budgets={"nlp": 5000.0})
    nodes = [node("a", "v4-8", "READY", 10, goodput='{"productive": 3000, "total": 3600}'),
             node("b", "v4-8", "STOPPED", 10)]  # not billing
    hourly = catalog.usd_per_hour(catalog.parse_accelerator_type("v4-8"), spot=False)
    assert hourly is not None
    summary = spend_of(target, "nlp", nodes, NOW)
    assert summary.spent_usd == pytest.approx(hourly * 10)
    lost = lost_usd(nodes)
    assert lost == pytest.approx(hourly * 600 / 3600)  # 600 s not productive
    left = (5000 - hourly * 10) / hourly
    runs_out = NOW + timedelta(hours=left)
    assert spend_line(summary, lost, NOW).plain == (
        f"team nlp spend: ${hourly * 10:,.2f} this month by the meter (TPU list prices); "
        f"burn ${hourly:,.2f}/h; budget $5,000 runs out in {left:,.1f} h "
        f"({runs_out:%Y-%m-%d %H:%M} UTC) at that rate; goodput lost ${lost:,.2f}")


def test_the_preview_shows_each_teams_burn_budget_stop_and_limits() -> None:
    from ops.plan.offline import offline_plan
    from ops.plan.report import spend_section

    config = file_config("platform")
    teams = json.loads(config["tpu-stack:teams"])
    teams["nlp"]["budgetAction"] = "stop"
    config["tpu-stack:teams"] = json.dumps(teams)
    settings = load_settings(config, "platform")
    nlp_nodes = settings.teams["nlp"].nodes
    burn = sum(catalog.usd_per_hour(n.tpu, spot=n.spot) or 0.0 for n in nlp_nodes)
    preview = {p.team: p for p in meter.team_previews(settings)}["nlp"]
    assert preview.usd_per_hour == pytest.approx(burn)
    assert preview.hours_to_budget == pytest.approx(60_000 / burn)
    assert preview.stop_deletes == ("platform-nlp-pod", "platform-nlp-sweep")
    assert [(n.node_id, n.max_runtime, n.idle_stop) for n in preview.limits] == [
        ("platform-nlp-pod", None, "1h"), ("platform-nlp-sweep", "12h", "30m")]

    plan = offline_plan("platform", config).to_json()
    assert plan["spend"]["nlp"]["budgetStopDeletes"] == ["platform-nlp-pod", "platform-nlp-sweep"]
    assert plan["spend"]["vision"]["budgetAction"] == "alert"
    text = spend_section(plan)
    assert text is not None
    assert (f"- team nlp: burn ${burn:,.2f}/hour; budget $60,000.00/month, reached in "
            f"{60_000 / burn:,.0f} h ({60_000 / burn / 24:,.1f} days) at this rate; budgetAction "
            "stop: a budget stop saves and deletes platform-nlp-pod, platform-nlp-sweep (and "
            "every node labelled team=nlp in its project)") in text
    assert "  - platform-nlp-sweep: maxRuntime 12h, idleStop 30m" in text


def test_status_prices_each_nodes_lost_goodput_in_its_own_column() -> None:
    hourly = catalog.usd_per_hour(catalog.parse_accelerator_type("v4-8"), spot=False)
    assert hourly is not None
    busy = node("a", "v4-8", "READY", 10, goodput='{"productive": 3000, "total": 3600}')
    silent = node("b", "v4-8", "READY", 10)
    assert node_lost_usd(busy) == pytest.approx(hourly * 600 / 3600)
    assert node_lost_usd(silent) is None
    target = StackTarget(project="acme", stack="platform", nodes=())
    rows = {cells[0]: dict(zip((c.header for c in COLUMNS), cells, strict=True))
            for cells, _ in status_rows(target, [busy, silent], [], "ABSENT")}
    assert rows["a"]["lost $"] == f"${hourly * 600 / 3600:,.2f}"
    assert rows["b"]["lost $"] == ""


def test_the_lost_usd_column_shows_where_a_node_has_a_figure() -> None:
    from rich.console import Console

    def rendered(nodes: list) -> str:
        console = Console(width=300, record=True)
        console.print(status_table(StackTarget(project="acme", stack="platform", nodes=()),
                                   nodes, wide=True))
        return console.export_text()

    busy = node("a", "v4-8", "READY", 10, goodput='{"productive": 3000, "total": 3600}')
    assert "lost $" in rendered([busy]) and "lost $" not in rendered([node("b", "v4-8",
                                                                          "READY", 10)])
