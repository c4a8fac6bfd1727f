"""What the controller logs each run (issue 46): a run line the controller-not-running
alert counts, and, per team with a budget, the budget-stop function's budget line (same
`spend <usd>` words, same decision) from the nodes the run listed, which the spend and
budget-runout log metrics count with the function's."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from model import meter, spend
from model import monitoring as m
from model.manifest import Manifest, TeamBudget, manifest_json, parse
from ops.controller.plan import Actual
from ops.controller.spend_lines import NOT_METERED, budget_lines
from ops.tpu.api import NodeStatus
from tests.controller.world import PROJECT, TAKES, World, plain_node, stack

NOW = datetime(2026, 12, 10, 12, tzinfo=timezone.utc)
OURS = {"team": "vision", "managed-by": "pulumi"}
VISION = "acme-ml-shared-vision"
BUDGET = TeamBudget("vision", VISION, 1000.0, 24.0)
ZONE = "us-central1-b"


def node(node_id: str, labels: dict[str, str] = OURS, project: str = VISION,
         state: str = "READY", hours: float = 10.0) -> NodeStatus:
    return NodeStatus(zone=ZONE, node_id=node_id, state=state, health="", spot=False,
                      accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite",
                      labels=labels, metadata={}, queued_resource="",
                      created=NOW - timedelta(hours=hours), project=project)


def manifest(*budgets: TeamBudget) -> Manifest:
    return Manifest(stack(), budgets=budgets)


def matches(log_filter: str, line: dict[str, Any]) -> bool:
    """Whether a JSON line's fields satisfy the filter's jsonPayload terms (the resource
    term is the function's: both log as Cloud Run functions)."""
    terms = re.findall(r'jsonPayload\.(\w+)=("([^"]*)"|true|false)', log_filter)
    assert terms, log_filter
    return all(line.get(key) == (text if quoted.startswith('"') else quoted == "true")
               for key, quoted, text in terms)


def test_an_alert_only_team_gets_the_budget_function_s_line_from_the_listed_nodes() -> None:
    actual = Actual([node("a"), node("b", state="STOPPED"),
                     node("other", labels={"team": "nlp", "managed-by": "pulumi"}),
                     node("elsewhere", project="acme-ml-shared-nlp")], [])
    [line] = budget_lines([manifest(BUDGET)], actual, {(VISION, ZONE)}, NOW)
    hourly = spend.hourly_usd(meter.price_table(), "v5litepod-8", False)
    assert hourly is not None and hourly > 0
    metered = hourly * 10  # node a only: 10 h this month; b is not billing
    assert line["message"] == m.BUDGET_LINE and line["team"] == "vision"
    assert line["nodes"] == [f"projects/{VISION}/locations/{ZONE}/nodes/a",
                             f"projects/{VISION}/locations/{ZONE}/nodes/b"]
    assert float(re.match(m.SPEND_PATTERN, line["reason"]).group(1)) == \
        round(metered, 2)
    # The function's own decision on the same figures (no reported cost).
    expected = spend.decide(spend.BudgetMessage("x", "", "", 0.0, 1000.0,
                                                meter.month_start(NOW), None, "USD"),
                            metered, hourly, 24.0)
    assert (line["act"], line["reason"]) == (expected.act, expected.reason)
    assert line["act"] is (metered + hourly * 24 >= 1000)


def test_a_runout_line_is_counted_by_the_runout_and_spend_metrics() -> None:
    small = TeamBudget("vision", VISION, 50.0, 24.0)
    [line] = budget_lines([manifest(small)], Actual([node("a")], []), {(VISION, ZONE)}, NOW)
    assert line["act"] is True and "reached the budget" in line["reason"]
    assert matches(m.BUDGET_RUNOUT.filter, line) and matches(m.SPEND.filter, line)
    calm = TeamBudget("vision", VISION, 10**6, 24.0)
    [line] = budget_lines([manifest(calm)], Actual([node("a")], []), {(VISION, ZONE)}, NOW)
    assert line["act"] is False
    assert not matches(m.BUDGET_RUNOUT.filter, line) and matches(m.SPEND.filter, line)


def test_a_team_whose_project_was_not_listed_is_not_metered_as_zero() -> None:
    unread = Actual([], [], frozenset({(VISION, ZONE)}))
    for actual, places in ((Actual([], []), {(PROJECT, ZONE)}), (unread, {(VISION, ZONE)})):
        [line] = budget_lines([manifest(BUDGET)], actual, places, NOW)
        assert line["message"] == NOT_METERED and "act" not in line
        assert not matches(m.SPEND.filter, line)


def test_the_manifest_carries_each_team_s_budget() -> None:
    text = manifest_json(stack(), budgets=(BUDGET,))
    assert parse(text).budgets == (BUDGET,)
    assert parse(manifest_json(stack())).budgets == ()


def test_the_run_line_is_what_the_controller_runs_metric_counts() -> None:
    from functions.controller.main import run_lines

    record = {"budgets": [{"message": m.BUDGET_LINE, "team": "vision", "act": True}]}
    lines = run_lines(record, {"run": "r1", "leased": True})
    assert [line["message"] for line in lines] == [m.CONTROLLER_RUN_LINE, m.BUDGET_LINE]
    assert matches(m.CONTROLLER_RUNS.filter, lines[0])
    assert not matches(m.CONTROLLER_RUNS.filter, lines[1])


def test_a_run_logs_the_budget_lines_of_the_nodes_it_listed(world: World) -> None:
    at = world.clock(0)
    world.tpu.add_node(TAKES, "dev-busy", accelerator_type="v6e-8", labels={
        "team": "platform", "managed-by": "pulumi"}, created=at - timedelta(hours=2))
    budget = TeamBudget("platform", PROJECT, 10.0, 24.0)
    target = stack(plain_node("dev-busy", TAKES))
    result = world.run(0, apply=False, manifests=[Manifest(target, budgets=(budget,))])
    [line] = result.record["budgets"]
    hourly = spend.hourly_usd(meter.price_table(), "v6e-8", False) or 0.0
    hours = spend.hours_between(max(at - timedelta(hours=2), meter.month_start(at)), at)
    assert line["team"] == "platform" and line["act"] is True
    assert float(re.match(m.SPEND_PATTERN, line["reason"]).group(1)) == round(hourly * hours, 2)
