"""The preview of a node's fallback candidates: price, step cost, headroom, one-quota warning.

Pure: the plan (ops/plan) and the program's warnings read it. Quota headroom is the
quota's limit less its usage less what the plan's other nodes take. Offline the limit is
the one the stack declares (`tpu-stack:quota`, the project's granted chips) and the usage
outside the plan is unknown, so the figure is an upper bound, shown `<=N`; where the stack
declares no quota for the family and region it is `unknown`, as is a reservation's
headroom (a candidate without a reservation has none to show: `n/a`). Live figures
(`tpuctl plan --live`, ops/tpu/headroom.py) are read by the caller and passed in: the
limit Cloud Quotas reports and the chips the project's nodes outside this stack hold
(live_headroom); exact, so shown without `<=`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from model import catalog, cost
from model.settings.schema import NodeSettings, StackSettings
from tpu_training.config import JobConfig

UNKNOWN = "unknown"


@dataclass(frozen=True)
class CandidateRow:
    position: int  # 1 = the node's own placement
    zone: str
    accelerator_type: str
    provisioning: str
    usd_per_hour: float | None
    usd_per_1000_steps: float | None
    quota: str  # the quota it draws on: its id, or family + type where the catalog has none
    quota_headroom: str  # chips, or "unknown" (offline)
    reservation_headroom: str  # chips, "unknown", or "n/a" (no reservation)

    def to_json(self) -> dict[str, object]:
        return {"position": self.position, "zone": self.zone,
                "acceleratorType": self.accelerator_type, "provisioning": self.provisioning,
                "usdPerHour": self.usd_per_hour, "usdPer1000Steps": self.usd_per_1000_steps,
                "quota": self.quota, "quotaHeadroom": self.quota_headroom,
                "reservationHeadroom": self.reservation_headroom}


def quota_of(node: NodeSettings) -> tuple[str, str]:
    """(the quota a placement draws on, its region): catalog.TPU_QUOTA_IDS by family and
    quota type (docs/tpu-facts.md: quota is per family and region, on-demand and
    preemptible apart), else `<family> <quota type>`."""
    family = node.tpu.generation.name
    quota = catalog.TPU_QUOTA_IDS.get((family, node.quota_type), f"{family} {node.quota_type}")
    return quota, catalog.region_of(node.zone)


def reservation_key(zone: str, name: str) -> tuple[str, str]:
    """(zone, reservation id): a queue's reservationName may be the id or its full name
    (`projects/<p>/locations/<zone>/reservations/<id>`)."""
    return zone, name.rsplit("/", 1)[-1]


def candidate_rows(node: NodeSettings, job: JobConfig | None,
                   headroom: Mapping[tuple[str, str], object] | None = None,
                   reservations: Mapping[tuple[str, str], str] | None = None
                   ) -> list[CandidateRow]:
    """One row per candidate, the node's own first. `headroom`: chips left per (quota,
    region) once the plan's other nodes are counted (declared_headroom); `reservations`:
    what is left of each reservation read live, by reservation_key."""
    rows = []
    for position, candidate in enumerate(node.candidates, start=1):
        priced = cost.node_cost(candidate, job=job)
        quota, region = quota_of(candidate)
        left = None if headroom is None else headroom.get((quota, region))
        reserved = candidate.capacity == "reserved"
        name = candidate.queue.reservation_name if candidate.queue else None
        left_in_reservation = (reservations or {}).get(
            reservation_key(candidate.zone, name)) if name else None
        rows.append(CandidateRow(
            position, candidate.zone, candidate.tpu.accelerator_type,
            _provisioning(candidate), priced.usd_per_hour,
            priced.step.usd_per_1000_steps if priced.step else None,
            quota, UNKNOWN if left is None else str(left),
            left_in_reservation or (UNKNOWN if reserved else "n/a")))
    return rows


def _provisioning(node: NodeSettings) -> str:
    if node.provisioning != "queued" or node.queue is None:
        return node.provisioning
    tier = ("spot" if node.queue.spot else "guaranteed" if node.queue.guaranteed else
            "reserved" if node.queue.reservation_name else "")
    return f"queued {tier}".strip()


def one_quota_warning(node: NodeSettings) -> str | None:
    """A node whose candidates all draw on one regional quota: one quota error there
    fails every candidate, so the fallback does not help against quota."""
    if not node.fallback:
        return None
    quotas = {quota_of(candidate) for candidate in node.candidates}
    if len(quotas) != 1:
        return None
    (quota, region), = quotas
    return (f"node {node.name}: every fallback candidate draws on one regional quota, "
            f"{quota} in {region}: when it runs out every candidate fails; add a candidate "
            f"in another region, or of another family or provisioning")


QuotaKey = tuple[str, str]  # (quota id, region), quota_of
# (project, quota id, region) -> the limit Cloud Quotas reports (-1: unlimited), or None.
LimitOf = Callable[[str, str, str], "int | None"]
Headroom = Callable[[StackSettings, NodeSettings], Mapping[QuotaKey, object]]
UNLIMITED = -1


def node_project(settings: StackSettings, node: NodeSettings) -> str:
    """The project `node` lives in (a team's node: its team's project)."""
    team = next(team for team, n in settings.named_nodes if n is node)
    return settings.node_project(team)


def taken_by_others(settings: StackSettings, node: NodeSettings) -> dict[QuotaKey, int]:
    """Chips the plan's other nodes in `node`'s project draw, per (quota, region): each
    at its own placement, where `up` tries it first (one with fallback may end up on
    another candidate; which one, only the state knows)."""
    project = node_project(settings, node)
    taken: dict[QuotaKey, int] = {}
    for team, other in settings.named_nodes:
        if other is not node and settings.node_project(team) == project:
            key = quota_of(other)
            taken[key] = taken.get(key, 0) + other.tpu.chips
    return taken


def live_headroom(settings: StackSettings, node: NodeSettings, limit_of: LimitOf,
                  used_outside: Mapping[tuple[str, str, str], int]
                  ) -> dict[QuotaKey, str]:
    """(quota, region) → chips left for each candidate: the limit in the node's project
    less what the project's nodes outside this stack hold (`used_outside`, by (project,
    quota, region)) less what the plan's other nodes take. A quota the catalog has no id
    for, or whose limit was not read, is left out (shown `unknown`)."""
    project = node_project(settings, node)
    taken = taken_by_others(settings, node)
    headroom = {}
    for candidate in node.candidates:
        quota, region = key = quota_of(candidate)
        if quota not in catalog.TPU_QUOTA_IDS.values():
            continue
        limit = limit_of(project, quota, region)
        if limit is None:
            continue
        headroom[key] = "unlimited" if limit == UNLIMITED else str(
            limit - used_outside.get((project, quota, region), 0) - taken.get(key, 0))
    return headroom


def declared_headroom(settings: StackSettings, node: NodeSettings) -> dict[tuple[str, str], str]:
    """(quota, region) → `<=N`: the stack's declared quota (`tpu-stack:quota`, its own
    project's) less what the plan's other nodes in that project take. {} for a team's node,
    which lives in its team's project."""
    own = [n for team, n in settings.named_nodes if team is None]
    if not any(n is node for n in own):
        return {}
    taken: dict[tuple[str, str], int] = {}
    for other in own:
        if other is not node:
            key = quota_of(other)
            taken[key] = taken.get(key, 0) + other.tpu.chips
    headroom = {}
    for family, by_region in settings.quota.items():
        for region, chips in by_region.items():
            for quota_type in ("onDemand", "preemptible"):
                quota = catalog.TPU_QUOTA_IDS.get((family, quota_type),
                                                  f"{family} {quota_type}")
                left = chips.of(quota_type) - taken.get((quota, region), 0)  # type: ignore[arg-type]
                headroom[(quota, region)] = f"<={left}"
    return headroom


def stack_candidates(settings: StackSettings, headroom: Headroom = declared_headroom,
                     reservations: Mapping[tuple[str, str], str] | None = None
                     ) -> dict[str, list[dict[str, object]]]:
    """The plan's `candidates`: each node with fallback's rows; {} when none has any.
    `headroom`: declared_headroom offline, live figures with `tpuctl plan --live`, as
    are `reservations` (candidate_rows)."""
    jobs = {id(node): job for node, job in settings.node_jobs}
    return {node.name: [row.to_json() for row in candidate_rows(
                node, jobs.get(id(node)), headroom(settings, node), reservations)]
            for _, node in settings.all_nodes if node.fallback}


def candidate_props(node: Any, subnetwork: Any) -> dict[str, Any]:
    """One candidate (a NodeSettings) as the fallback provider's placement
    (components/fallback_tpu.py); `subnetwork` a name or a Pulumi input of one."""
    tpu = node.tpu
    by_shape = node.accelerator_type is None
    queue = node.queue
    # Every candidate is queued: its label names the tier (`2/4 us-east5-b spot`).
    tier = ("spot" if node.spot else "reserved" if queue and queue.reservation_name else
            "guaranteed" if queue and queue.guaranteed else "on-demand")
    return {
        "zone": node.zone,
        "provisioning": tier,
        "accelerator_type": node.accelerator_type,
        "accelerator_config_type": tpu.generation.api_type if by_shape else None,
        "accelerator_topology": tpu.topology if by_shape else None,
        "runtime_version": node.runtime,
        "subnetwork": subnetwork,
        "spot": node.spot,
        "guaranteed": bool(queue and queue.guaranteed),
        "reservation_name": queue.reservation_name if queue else None,
        "valid_until_seconds": queue.valid_until_seconds if queue else None,
        "generation": tpu.generation.name,
        "chips": tpu.chips,
        "quota_type": node.quota_type,
    }


def candidate_label(index: int, count: int, candidate: dict[str, Any]) -> str:
    """`2/4 us-east5-b spot`: where the node is and on which tier."""
    return f"{index}/{count} {candidate['zone']} {candidate.get('provisioning') or 'on-demand'}"
