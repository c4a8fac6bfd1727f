"""Each controller run, one budget line per team with a budget (issue 46): the spend and
runout decision the budget-stop function logs at a notification (model/spend.py `decide`,
the same words: `spend <usd> ...`), from the nodes the run already listed, priced by the
catalog (model/meter.py). So a team whose budget only alerts gets a runout alert too
(components/monitoring.py counts these lines with the function's: model/monitoring.py).

The controller has no billing figure: its line's `reported` is 0 and its spend is the
meter's (TPUs at list price since the budget month's start). Pure: the function prints
the lines (functions/controller/main.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from model import meter, spend
from model import monitoring as m
from model.manifest import Manifest, TeamBudget
from model.naming import MANAGED_BY, label_value
from ops.controller.plan import Actual
from ops.tpu.api import NodeStatus

NOT_METERED = "budget not metered"


def budget_lines(manifests: Sequence[Manifest], actual: Actual,
                 places: Iterable[tuple[str, str]], now: datetime) -> list[dict[str, Any]]:
    """A budget line per team with a budget in any manifest (the first manifest's budget
    where two name the team); a team none of whose project's zones was read this run
    gets a `budget not metered` line instead of a figure of 0."""
    read = set(places) - set(actual.unread)
    budgets: dict[str, TeamBudget] = {}
    for manifest in manifests:
        for budget in manifest.budgets:
            budgets.setdefault(budget.team, budget)
    return [_line(budget, actual, read, now) for _, budget in sorted(budgets.items())]


def _line(budget: TeamBudget, actual: Actual, read: set[tuple[str, str]],
          now: datetime) -> dict[str, Any]:
    zones_read = sorted(zone for project, zone in read if project == budget.project)
    if not zones_read:
        return {"message": NOT_METERED, "team": budget.team, "source": m.CONTROLLER_SOURCE,
                "reason": f"no zone of {budget.project} was listed this run"}
    nodes = [node for node in actual.nodes if _ours(node, budget)]
    running = [n for n in (meter.metered(node.name, node.accelerator_type, node.spot,
                                         node.state, node.created) for node in nodes) if n]
    decision = decide(budget, running, now)
    line: dict[str, Any] = {
        "message": m.BUDGET_LINE, "team": budget.team, "act": decision.act,
        "reason": decision.reason, "source": m.CONTROLLER_SOURCE,
        "nodes": [node.name for node in nodes],
        "unpriced": spend.unpriced(meter.price_table(), running)}
    unread = sorted(zone for project, zone in actual.unread if project == budget.project)
    if unread:
        line["unread"] = unread  # the figure leaves these zones' nodes out
    return line


def _ours(node: NodeStatus, budget: TeamBudget) -> bool:
    """The budget function's rule: the team's project, labelled its team, by the stack."""
    return node.project == budget.project and node.labels.get("team") == \
        label_value(budget.team) and node.labels.get("managed-by") == MANAGED_BY


def decide(budget: TeamBudget, running: Sequence[spend.MeteredNode],
           now: datetime) -> spend.Decision:
    """The budget function's decision on the meter alone (no reported cost)."""
    prices, start = meter.price_table(), meter.month_start(now)
    message = spend.BudgetMessage(
        budget_id=m.CONTROLLER_SOURCE, billing_account="", display_name=budget.team,
        cost_usd=0.0, budget_usd=budget.usd_per_month, interval_start=start,
        threshold_exceeded=None, currency="USD")
    return spend.decide(message, spend.meter_usd(prices, running, start, now),
                        spend.burn_usd_per_hour(prices, running), budget.horizon_hours)
