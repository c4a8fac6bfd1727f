"""The spend meter: what TPUs cost by the catalog's list prices, and when a budget runs out.

The same arithmetic the budget-stop function acts on (model/spend.py,
priced by components/budget_stop.py `price_table` from model/catalog.py): each
node's hourly list price (spot or on-demand) times the hours it ran. Billing data lags by
hours; the meter does not, but it knows TPUs only (no disks, egress, logging), list
prices only (no discounts, no commitments), and counts a node from its creation (or the
month's start) while the API shows it billing (spend.BILLED_STATES): an estimate, not
the bill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from model import catalog, spend
from model.settings.schema import NodeSettings, StackSettings, TeamSettings

# Cloud Billing budgets' calendar periods begin "at 12 AM US and Canadian Pacific Time
# (UTC-8)" (Cloud Billing Budget API, google.cloud.billing.budgets.v1 Filter): a month's
# spend counts from 08:00 UTC on its first day.
PERIOD_START_UTC_HOUR = 8


def month_start(now: datetime) -> datetime:
    """The start of the budget month holding `now` (PERIOD_START_UTC_HOUR)."""
    start = now.astimezone(timezone.utc).replace(day=1, hour=PERIOD_START_UTC_HOUR, minute=0,
                                                 second=0, microsecond=0)
    if start > now:  # before 08:00 on the 1st: still last month
        start = (start - timedelta(days=1)).replace(day=1)
    return start


def team_budget_usd(spec: TeamSettings) -> float | None:
    """A team's monthly budget as the platform declares it (components/platform.py
    _budget): its own figure, else its hourly ceiling for a month; None when neither is
    given (then the budget follows last month's spend, which nothing here knows)."""
    if spec.budget_usd_per_month is not None:
        return spec.budget_usd_per_month
    if spec.quota.usd_per_hour is not None:
        return spec.quota.usd_per_hour * catalog.HOURS_PER_MONTH
    return None


def team_budgets(settings: StackSettings) -> dict[str, float]:
    """Every team with a monthly budget figure (team_budget_usd), by team."""
    return {team: amount for team, spec in settings.teams.items()
            if (amount := team_budget_usd(spec)) is not None}


def node_hourly_usd(node: NodeSettings) -> float | None:
    """A planned node's list price per hour, as the meter prices it."""
    return spend.hourly_usd(price_table(), node.tpu.accelerator_type, node.spot)


def plan_meter_usd(nodes: Iterable[NodeSettings], hours: float) -> float:
    """What the planned nodes cost running for `hours`, by the meter."""
    return sum((node_hourly_usd(node) or 0.0) * hours for node in nodes)


@dataclass(frozen=True)
class TeamSpend:
    team: str
    spent_usd: float  # this budget month, by the meter
    burn_usd_per_hour: float  # the nodes running now
    budget_usd: float | None  # the team's monthly budget, where set
    unpriced: tuple[str, ...] = ()

    @property
    def hours_left(self) -> float | None:
        """Hours until the budget is spent at the burn rate; None without a budget or burn."""
        if self.budget_usd is None:
            return None
        return spend.hours_left(self.budget_usd, self.spent_usd, self.burn_usd_per_hour)

    def runs_out(self, now: datetime) -> datetime | None:
        left = self.hours_left
        return None if left is None else now + timedelta(hours=left)


def metered(name: str, accelerator_type: str, spot: bool, state: str,
            created: datetime | None) -> spend.MeteredNode | None:
    """A listed node as the meter counts it; None when it is not billing (or undated)."""
    if state not in spend.BILLED_STATES or created is None:
        return None
    return spend.MeteredNode(name, accelerator_type, spot, created)


def team_spend(team: str, nodes: Iterable[spend.MeteredNode], budget_usd: float | None,
               now: datetime) -> TeamSpend:
    """The team's spend this budget month from its running nodes (their create times)."""
    table, running = price_table(), list(nodes)
    return TeamSpend(team, spend.meter_usd(table, running, month_start(now), now),
                     spend.burn_usd_per_hour(table, running), budget_usd,
                     tuple(spend.unpriced(table, running)))


def lost_usd(goodput: Mapping[str, object], hourly_usd: float | None) -> float | None:
    """Goodput's lost seconds priced: everything but `productive` (idle, restarts, lost
    progress, start-up) at the node's hourly price; None without a price or figures."""
    if hourly_usd is None:
        return None
    try:
        total, productive = float(goodput["total"]), float(goodput["productive"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    return max(0.0, total - productive) / spend.SECONDS_PER_HOUR * hourly_usd


# ---- the preview, per team -----------------------------------------------------------

@dataclass(frozen=True)
class NodeLimits:
    node_id: str
    max_runtime: str | None
    idle_stop: str | None


@dataclass(frozen=True)
class TeamPreview:
    """What a plan says of a team's money: its burn rate by the meter, how long its budget
    lasts at that rate from an empty month, what a budget stop would delete, the limits."""

    team: str
    usd_per_hour: float
    budget_usd_per_month: float | None
    budget_action: str  # alert | stop
    stop_deletes: tuple[str, ...]  # node ids this stack declares for the team (stop only)
    limits: tuple[NodeLimits, ...]
    unpriced: tuple[str, ...] = ()

    @property
    def hours_to_budget(self) -> float | None:
        if self.budget_usd_per_month is None:
            return None
        return spend.hours_left(self.budget_usd_per_month, 0.0, self.usd_per_hour)


def team_previews(settings: StackSettings) -> list[TeamPreview]:
    """One preview per team with nodes in this stack or a budget here, by name."""
    by_team: dict[str, list[tuple[str, NodeSettings]]] = {}
    for team, node in settings.named_nodes:
        node_id = settings.naming.tpu_node(node.name, team)
        by_team.setdefault(team or settings.team, []).append((node_id, node))
    previews = []
    for team in sorted(set(by_team) | set(settings.teams)):
        nodes = sorted(by_team.get(team, []), key=lambda pair: pair[0])  # by node id
        spec = settings.teams.get(team)
        action = spec.budget_action if spec else "alert"
        hourly = {node_id: node_hourly_usd(node) for node_id, node in nodes}
        previews.append(TeamPreview(
            team=team, usd_per_hour=sum(v or 0.0 for v in hourly.values()),
            # A budget only where the plan declares one (platform.py: on the teams'
            # billing account), never one it dropped (issue 44).
            budget_usd_per_month=spec.budget_usd_per_month
            if spec and settings.team_billing_account else None,
            budget_action=action,
            stop_deletes=tuple(node_id for node_id, _ in nodes) if action == "stop" else (),
            limits=tuple(NodeLimits(node_id, node.max_runtime, node.idle_stop)
                         for node_id, node in nodes),
            unpriced=tuple(node_id for node_id, usd in hourly.items() if usd is None)))
    return previews


def price_table() -> dict[str, dict[str, float | None]]:
    """Per accelerator-type prefix, USD per hour of one unit of the number in the type's
    name (TensorCores or chips, catalog.Naming), on-demand and spot: what
    model/spend.py prices a node with."""
    table: dict[str, dict[str, float | None]] = {}
    for generation in catalog.GENERATIONS.values():
        units_per_chip = generation.cores_per_chip \
            if generation.naming is catalog.Naming.TENSORCORES else 1
        price = generation.price
        table[generation.type_prefix] = {
            rate: None if per_chip is None else per_chip / units_per_chip
            for rate, per_chip in (("onDemand", price.on_demand), ("spot", price.spot))}
    return table
