"""Hourly cost estimate per node and per stack, from the catalog's list prices.

TPU nodes only: buckets, network and logging are not priced. A reserved node (a
reservation, or a queue that names one) is billed through its reservation: the
reservation is charged at the on-demand rate from its creation, used or not, and a
VM consuming it incurs no separate charge (cloud.google.com/compute/docs/instances/
reservations-overview; for TPU reservations unconfirmed, docs/tpu-facts.md "Prices").
So it is priced at the on-demand list price and marked `reserved`, unless it runs under
a commitment (`commitment: 1-year | 3-year`, a reservation with a committed use discount
attached): then at that committed-use price. Every node also carries its price at each
rate (on-demand, spot, 1-year, 3-year), so the estimate can show them side by side.

Where the node's job is known (a stack's settings), it also carries the cost of one
training step (`StepCost`): the step's seconds as the stop budget estimates them
(model/stop_save.py, `step_seconds`: FLOPs-bound at an assumed utilisation) at the
node's hourly price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model import catalog
from model.settings.schema import NodeSettings, StackSettings
from model.stop_save import step_seconds
from tpu_training.config import JobConfig, recipe, train_flops_per_example

SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class StepCost:
    """One training step of a node's job: its seconds (FLOPs-bound, stop_save.py) and
    what it costs at the node's hourly price (None where the catalog has none)."""

    job: str
    model: str
    global_batch_size: int
    flops_per_example: float
    peak_flops_per_second: float
    seconds: float
    usd: float | None
    # What the figure rests on that the catalog marks unconfirmed: "utilisation",
    # "peak" (the generation's peak FLOPs), "price".
    unconfirmed: tuple[str, ...] = ()
    # The job's learning-rate and optimizer recipe (tpu_training.config.recipe), as the
    # job's `recipe` line gives it: optimizer=… peak_learning_rate=… …
    recipe: str = ""

    @property
    def usd_per_1000_steps(self) -> float | None:
        return None if self.usd is None else self.usd * 1000


def step_cost(node: NodeSettings, job: JobConfig, usd_per_hour: float | None,
              price_confirmed: bool) -> StepCost:
    """`job`'s training step on `node`, priced at `usd_per_hour` (the node's own rate)."""
    seconds = step_seconds(node, job)
    unsure = {"utilisation": not catalog.ASSUMED_FLOPS_UTILIZATION_CONFIRMED,
              "peak": node.tpu.generation.name in catalog.PEAK_FLOPS_UNCONFIRMED,
              "price": usd_per_hour is not None and not price_confirmed}
    return StepCost(
        job=node.job, model=job.model, global_batch_size=job.globalBatchSize,
        flops_per_example=train_flops_per_example(job),
        peak_flops_per_second=catalog.peak_flops_per_second(node.tpu), seconds=seconds,
        usd=None if usd_per_hour is None else usd_per_hour * seconds / SECONDS_PER_HOUR,
        unconfirmed=tuple(what for what, unsure in unsure.items() if unsure),
        recipe=recipe(job).line().removeprefix("recipe "))


@dataclass(frozen=True)
class NodeCost:
    name: str
    chips: int
    usd_per_hour: float | None  # list price at the node's own rate (spot or on-demand)
    on_demand_usd_per_hour: float | None
    team: str | None = None  # set where a stack serves teams (docs/teams.md)
    spot: bool = False
    reserved: bool = False  # billed through its reservation
    price_confirmed: bool = True
    price_source: str = ""
    commitment: str | None = None  # runs under a 1-year or 3-year commitment
    committed_confirmed: bool = True  # the generation's committed-use prices
    # The slice at every rate (RATES), None where the catalog has no such price.
    by_rate: dict[str, float | None] = field(default_factory=dict)
    step: StepCost | None = None  # where the node's job is known (settings_cost)

    @property
    def spot_saving_usd_per_hour(self) -> float | None:
        """Against on-demand, for a node billed at spot rates only."""
        if not self.spot or self.usd_per_hour is None or self.on_demand_usd_per_hour is None:
            return None
        return round(self.on_demand_usd_per_hour - self.usd_per_hour, 4)


# The rates a slice can be billed at, as the plan's JSON names them.
RATES = ("onDemand", "spot", "oneYear", "threeYear")


@dataclass(frozen=True)
class StackCost:
    nodes: list[NodeCost]

    def usd_per_hour_at(self, rate: str) -> float | None:
        """Every node at `rate`; None when a node has no price at that rate."""
        prices = [n.by_rate.get(rate) for n in self.nodes]
        if not prices or any(p is None for p in prices):
            return None
        return round(sum(prices), 4)  # type: ignore[arg-type]

    @property
    def usd_per_hour(self) -> float:
        """Sum over nodes the catalog can price; `unpriced` names the rest."""
        return round(sum(n.usd_per_hour or 0.0 for n in self.nodes), 4)

    @property
    def usd_per_month(self) -> float:
        return round(self.usd_per_hour * catalog.HOURS_PER_MONTH, 2)

    @property
    def unpriced(self) -> list[str]:
        return [n.name for n in self.nodes if n.usd_per_hour is None]

    @property
    def reserved(self) -> list[str]:
        return [n.name for n in self.nodes if n.reserved]

    @property
    def unconfirmed(self) -> list[str]:
        """Nodes priced from a price the catalog marks unconfirmed."""
        return [n.name for n in self.nodes if n.usd_per_hour is not None
                and not n.price_confirmed]

    def by_team(self) -> dict[str, StackCost]:
        """The estimate per team, for the nodes that name one."""
        teams: dict[str, list[NodeCost]] = {}
        for n in self.nodes:
            if n.team is not None:
                teams.setdefault(n.team, []).append(n)
        return {team: StackCost(nodes) for team, nodes in sorted(teams.items())}


def node_cost(node: NodeSettings, team: str | None = None, name: str | None = None,
              job: JobConfig | None = None) -> NodeCost:
    """`node`'s price; with `job` (the job it runs), also the cost of one of its steps."""
    tpu = node.tpu
    price = tpu.generation.price
    confirmed = price.committed_confirmed if node.commitment else price.confirmed
    source = f"{tpu.generation.name}: {price.source}"
    if node.commitment:
        source += f"; committed use: {price.committed_source}"
    hourly = catalog.usd_per_hour(tpu, spot=node.spot, commitment=node.commitment)
    return NodeCost(
        name=name or node.name,
        chips=tpu.chips,
        usd_per_hour=hourly,
        on_demand_usd_per_hour=catalog.usd_per_hour(tpu, spot=False),
        team=team,
        spot=node.spot,
        reserved=node.capacity == "reserved",
        price_confirmed=confirmed,
        price_source=source,
        commitment=node.commitment,
        committed_confirmed=price.committed_confirmed,
        by_rate=rates(tpu),
        step=None if job is None else step_cost(node, job, hourly, confirmed),
    )


def rates(tpu: catalog.Slice) -> dict[str, float | None]:
    """The slice's hourly list price at every rate (RATES)."""
    return {"onDemand": catalog.usd_per_hour(tpu, spot=False),
            "spot": catalog.usd_per_hour(tpu, spot=True),
            "oneYear": catalog.usd_per_hour(tpu, spot=False, commitment="1-year"),
            "threeYear": catalog.usd_per_hour(tpu, spot=False, commitment="3-year")}


def settings_cost(settings: StackSettings) -> StackCost:
    """Every node of the stack, with the cost of a step of its job. Where the stack
    serves teams, each node names its team, and a team's node is `<team>-<node>`, as its
    TpuNode component (`node-<team>-<node>`, components/platform.py) is."""
    # node_jobs lists the nodes in all_nodes' order (the stack's own, then each team's).
    jobs = [job for _, job in settings.node_jobs]
    if not (settings.teams or settings.is_team_stack):
        return StackCost([node_cost(node, job=job)
                          for node, job in zip(settings.nodes, jobs, strict=True)])
    def name(team: str, node: NodeSettings) -> str:
        own = team == settings.team and not settings.is_team_stack
        return node.name if own else f"{team}-{node.name}"

    return StackCost([node_cost(node, team, name(team, node), job)
                      for (team, node), job in zip(settings.all_nodes, jobs, strict=True)])


def stack_cost(nodes: list[NodeSettings]) -> StackCost:
    return StackCost([node_cost(node) for node in nodes])


def team_costs(nodes: list[tuple[str, NodeSettings]]) -> dict[str, StackCost]:
    """The estimate per team, from (team, node) pairs (StackSettings.all_nodes)."""
    by_team: dict[str, list[NodeCost]] = {}
    for team, node in nodes:
        by_team.setdefault(team, []).append(node_cost(node))
    return {team: StackCost(costs) for team, costs in sorted(by_team.items())}
