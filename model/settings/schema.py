"""The stack config's shape: pydantic models of every `tpu-stack:` key (camelCase
aliases, unknown keys refused), the one error type, and the key names."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic.alias_generators import to_camel

from model import catalog
from model.naming import (
    Naming,
)
from tpu_training.config import JobConfig

NAMESPACE = "tpu-stack"
GCP_PROJECT_KEY = "gcp:project"

Provisioning = Literal["on-demand", "spot", "preemptible", "reserved", "queued"]
Environment = Literal["dev", "prod"]
Capacity = Literal["onDemand", "spot", "reserved"]
Commitment = Literal["1-year", "3-year"]  # catalog.COMMITMENTS
QuotaType = Literal["onDemand", "preemptible"]

# cloud.google.com/resource-manager/docs/creating-managing-projects: 6-30
# characters, lowercase letters, digits and hyphens, starting with a letter.
PROJECT_ID_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# cloud.google.com/billing/docs/how-to/find-billing-account-id: XXXXXX-XXXXXX-XXXXXX.
BILLING_RE = re.compile(r"^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$")
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
DURATION_RE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>[smhd])$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class SettingsError(ValueError):
    """Every problem in a stack config, each as (key path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  {key}: {message}" for key, message in problems)
        super().__init__(f"the stack config has {count}:\n{lines}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel,
                              populate_by_name=True)


class ProjectSettings(_Model):
    """`tpu-stack:project`: adopt `gcp:project` as it is, or create it."""

    create: bool = False
    billing_account: str | None = None
    folder_id: str | None = None
    org_id: str | None = None


class NetworkSettings(_Model):
    """`tpu-stack:network`: the VPC the nodes live in."""

    subnet_cidr: str = "10.128.0.0/20"
    ssh_through_iap: bool = True
    # Ranges pinned as they are (region → CIDR), e.g. a stack's ranges from before
    # the fixed slots (model/subnets.py); other regions take their slot.
    subnets: dict[str, str] = Field(default_factory=dict)
    # Where each team's own subnets are carved (a platform stack; model/subnets.py,
    # team_range): team slot t's /18, region slot k's /22 in it.
    team_subnet_cidr: str = "10.160.0.0/12"


class StorageSettings(_Model):
    """`tpu-stack:storage`: the data, artifacts, checkpoints and logs buckets."""

    location: str
    force_destroy: bool = False
    protect: bool = True
    checkpoint_versions_days: int = Field(default=30, ge=1)
    log_retention_days: int = Field(default=90, ge=1)


class QueueSettings(_Model):
    """A node's `queue` block, only with `provisioning: queued`."""

    spot: bool = False
    guaranteed: bool = False
    reservation_name: str | None = None
    valid_until_duration: str | None = None

    @property
    def valid_until_seconds(self) -> int | None:
        if self.valid_until_duration is None:
            return None
        seconds = duration_seconds(self.valid_until_duration)
        assert seconds is not None, "checked by _queue_problems"
        return seconds


class FallbackSettings(_Model):
    """One entry of a node's `fallback`: the placement it overrides; what it does not
    name comes from the node (NodeSettings.candidates)."""

    zone: str | None = None
    provisioning: Provisioning | None = None
    accelerator_type: str | None = None
    generation: str | None = None
    topology: str | None = None
    queue: QueueSettings | None = None


# A node with `fallback` and no `maxWait` waits this long on each candidate.
DEFAULT_MAX_WAIT = "30m"


class NodeSettings(_Model):
    """One entry of `tpu-stack:nodes`."""

    name: str
    zone: str
    job: str
    accelerator_type: str | None = None
    generation: str | None = None
    topology: str | None = None
    runtime_version: str | None = None
    provisioning: Provisioning = "on-demand"
    queue: QueueSettings | None = None
    external_ips: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    # Runs under a committed use discount: the cost estimate prices it at that rate.
    commitment: Commitment | None = None
    # Candidates tried in order after the node's own placement (components/fallback_tpu.py).
    fallback: list[FallbackSettings] = Field(default_factory=list)
    max_wait: str | None = None
    allow_costlier: bool = False
    # Run-time limits (durations, node_agent/limits.py): the node's whole life, and how
    # long it may go without progress before the agent stops the job with a save.
    max_runtime: str | None = None
    idle_stop: str | None = None

    @property
    def max_runtime_seconds(self) -> int | None:
        return duration_seconds(self.max_runtime)

    @property
    def idle_stop_seconds(self) -> int | None:
        return duration_seconds(self.idle_stop)

    @property
    def tpu(self) -> catalog.Slice:
        """The slice; valid once the settings have been checked."""
        if self.accelerator_type:
            return catalog.parse_accelerator_type(self.accelerator_type)
        return catalog.slice_for(self.generation or "", self.topology or "")

    @property
    def runtime(self) -> str:
        runtime = self.runtime_version or catalog.runtime_for(self.tpu)
        assert runtime, "checked by _node_problems"
        return runtime

    @property
    def spot(self) -> bool:
        """Billed at spot rates: spot and preemptible capacity, or a spot queue."""
        if self.provisioning == "queued":
            return bool(self.queue and self.queue.spot)
        return self.provisioning in ("spot", "preemptible")

    @property
    def capacity(self) -> Capacity:
        """What a team's quota counts the node against: reserved capacity (a
        reservation, or a queue naming one), spot (spot, preemptible, a spot
        queue) or on-demand."""
        if self.provisioning == "reserved" or (
                self.provisioning == "queued" and self.queue and self.queue.reservation_name):
            return "reserved"
        return "spot" if self.spot else "onDemand"

    @property
    def quota_type(self) -> QuotaType:
        """The project quota the node draws on. cloud.google.com/tpu/docs/plan-tpus
        and /consumption-options: Spot VMs use preemptible quota, reservations
        use on-demand quota (docs/tpu-facts.md: "Quota is per TPU family and region,
        separately for on-demand and preemptible")."""
        return "preemptible" if self.capacity == "spot" else "onDemand"

    @property
    def candidates(self) -> list[NodeSettings]:
        """The node's own placement, then each `fallback` entry over it: an entry naming
        acceleratorType drops the node's generation + topology and the other way round,
        one naming a provisioning other than queued drops the node's queue."""
        return [self] + [self._over(entry) for entry in self.fallback]

    def _over(self, entry: FallbackSettings) -> NodeSettings:
        update: dict[str, Any] = entry.model_dump(exclude_none=True, exclude={"queue"})
        if entry.accelerator_type:
            update.update(generation=None, topology=None)
        elif entry.generation or entry.topology:
            update["accelerator_type"] = None
        if entry.queue is not None:
            update["queue"] = entry.queue
        elif entry.provisioning not in (None, "queued"):
            update["queue"] = None
        candidate = self.model_copy(update={**update, "fallback": [], "max_wait": None})
        if candidate.commitment and candidate.capacity != "reserved":
            # A commitment is a reservation's discount: not one of an unreserved candidate.
            candidate = candidate.model_copy(update={"commitment": None})
        return candidate

    @property
    def max_wait_seconds(self) -> int:
        """How long a request may wait on one candidate before the next is tried."""
        seconds = duration_seconds(self.max_wait or DEFAULT_MAX_WAIT)
        assert seconds is not None, "checked by _fallback_problems"
        return seconds

    @property
    def workers(self) -> str:
        """`tpu-stack-workers`: every worker runs a client, or worker 0 only
        (pod slices run one TF client; docs/tpu-facts.md, "TensorFlow on TPU")."""
        return "0" if self.tpu.multi_host else "all"


def duration_seconds(text: str | None) -> int | None:
    """A duration's seconds; None when absent or not a duration (the rules say so)."""
    match = DURATION_RE.match(text or "")
    return int(match["n"]) * _DURATION_SECONDS[match["unit"]] if match else None


class CiSettings(_Model):
    """`tpu-stack:ci`: keyless CI through Workload Identity Federation."""

    github_repository: str
    # GitHub's numeric ids never change and are never reused, unlike names
    # (google-github-actions/auth docs/SECURITY_CONSIDERATIONS.md); YAML may write them
    # as numbers, the OIDC token carries them as strings.
    github_repository_id: str
    github_repository_owner_id: str
    # The deployer is bound to this branch and this GitHub environment (default: the stack name).
    deploy_branch: str = "main"
    deploy_environment: str | None = None
    pool_id: str = "github"
    provider_id: str = "github"

    @field_validator("github_repository_id", "github_repository_owner_id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class ProjectChips(_Model):
    """Chips the project is granted in one TPU family and region
    (`tpu-stack:quota.<family>.<region>`), by quota type (NodeSettings.quota_type).
    Counted in chips for every family; for v2/v3 GCP counts TensorCores (2 per chip)."""

    on_demand: int = Field(default=0, ge=0)
    preemptible: int = Field(default=0, ge=0)

    def of(self, quota_type: QuotaType) -> int:
        return self.on_demand if quota_type == "onDemand" else self.preemptible


class TeamChips(_Model):
    """Chips a team may hold in one TPU family, by capacity (NodeSettings.capacity)."""

    on_demand: int = Field(default=0, ge=0)
    spot: int = Field(default=0, ge=0)
    reserved: int = Field(default=0, ge=0)

    def of(self, capacity: Capacity) -> int:
        return {"onDemand": self.on_demand, "spot": self.spot, "reserved": self.reserved}[capacity]


class TeamQuotaBase(_Model):
    usd_per_hour: float | None = Field(default=None, gt=0)

    def chips(self, family: str) -> TeamChips:
        return getattr(self, family)


# `tpu-stack:teams.<team>.quota`: one TeamChips per TPU family the catalog
# knows (so `quota.v5e.spot` is a key path and an unknown family is refused),
# and an optional USD-per-hour ceiling at list prices.
TeamQuota = create_model(  # type: ignore[call-overload]
    "TeamQuota", __base__=TeamQuotaBase,
    **{family: (TeamChips, Field(default_factory=TeamChips, alias=family))
       for family in catalog.GENERATIONS},
)


class AlertsSettings(_Model):
    """`tpu-stack:alerts` or `teams.<t>.alerts`: where the stack's alerts go and when they
    fire (components/monitoring.py; model/settings/rules/alerts.py checks them)."""

    email: str | None = None  # an email notification channel
    pubsub_topic: str | None = None  # projects/<p>/topics/<t>: a Pub/Sub notification channel
    idle_minutes: int | None = Field(default=None, ge=1)  # default: the nodes' idleStop, or 60
    goodput_target: float = Field(default=0.5, gt=0, le=1)  # goodput / elapsed time
    goodput_window: str = "1h"

    @property
    def has_channel(self) -> bool:
        return bool(self.email or self.pubsub_topic)


class TeamSettings(_Model):
    """One entry of `tpu-stack:teams`: who is in the team, what it runs, what it may use."""

    members: list[str] = Field(default_factory=list)
    nodes: list[NodeSettings] = Field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    quota: TeamQuota = Field(default_factory=TeamQuota)  # type: ignore[valid-type]
    labels: dict[str, str] = Field(default_factory=dict)
    budget_usd_per_month: float | None = Field(default=None, gt=0)
    # `stop`: a budget notification at or past the budget (or projected to reach it within
    # budget_horizon_hours) saves and deletes the team's nodes (components/budget_stop.py);
    # `alert`: the budget only notifies.
    budget_action: Literal["alert", "stop"] = "alert"
    budget_horizon_hours: float = Field(default=24.0, gt=0)
    # "YYYY-MM": lifts the hold a budget stop of that interval put on the team's nodes
    # (components/budget_hold.py); None: a stopped team stays held until the next interval.
    lift_budget_hold: str | None = None
    # The team's keyless deployer (its own repository's CI), declared by the platform
    # in the team's project (docs/teams.md); None: the team has no CI deployer.
    ci: CiSettings | None = None
    # The team's block of network.teamSubnetCidr (model/subnets.py): given once,
    # never changed or reused, so its subnets never move.
    subnet_slot: int | None = Field(default=None, ge=0)
    alerts: AlertsSettings | None = None  # required: its channel (rules/alerts.py)
    # Regions the team's subnets and quota caps exist in, beside those of the nodes the
    # platform declares for it (model/team_regions.py): where its team stack's nodes and
    # their fallback candidates run.
    regions: list[str] = Field(default_factory=list)

    def job(self, name: str) -> JobConfig:
        return JobConfig.from_dict(self.jobs[name], resolved=False)


class TeamProjectsSettings(_Model):
    """`tpu-stack:teamProjects`: where the platform creates each team's project."""

    folder_id: str | None = None  # required: checked with the other keys (_team_projects_problems)
    billing_account: str | None = None  # default: tpu-stack:billing.account
    # Cloud Quotas requires a contact email on a preference above the granted value
    # (QuotaPreference.contact_email: "required for increase quota preferences").
    quota_contact: str | None = None
    # The gs:// bucket of a self-managed backend holding every stack's state: each
    # team's deployer may write its own stack's files only (model/team_state.py).
    state_bucket: str | None = None
    # The platform deployer's email (the bootstrap's --deployer): the platform grants it
    # actAs on the runtime accounts of the team nodes it declares (components/teams.py).
    deployer: str | None = None


class BillingSettings(_Model):
    """`tpu-stack:billing`: where per-team budgets live."""

    account: str
    alert_thresholds: list[float] = Field(default_factory=lambda: [0.5, 0.9, 1.0])


# `tpu-stack:controller` (issue 43, components/controller.py): the placement and limits
# controller, run by Cloud Scheduler every `interval` (a cron step: minutes dividing an
# hour, or an hour). A platform stack, or a standalone stack that asks for it.
ControllerInterval = Literal["1m", "2m", "5m", "10m", "15m", "30m", "1h"]


class ControllerSettings(_Model):
    """`tpu-stack:controller`: {enabled: true, interval: 5m}."""

    enabled: bool = False
    interval: ControllerInterval = "5m"


class SharedReservationSettings(_Model):
    """One of `tpu-stack:sharedReservations`: another project's TPU reservation, shared
    with the consumer projects named (model/shared_reservations.py, issue 44)."""

    name: str
    owner: str  # the owner project's id
    owner_project_number: str  # the org policy names the owner by number
    zone: str
    generation: str
    share_type: str = "SPECIFIC_PROJECTS"
    consumers: list[str] = Field(default_factory=list)  # consumer project ids


class StackSettings(_Model):
    """The whole stack config, checked."""

    stack: str
    gcp_project: str
    # The deployment's organization (pulumi.get_organization(): "organization" on
    # a self-managed backend); None where unknown, as in an offline plan.
    organization: str | None = None
    environment: Environment = "prod"
    team: str = "platform"
    labels: dict[str, str] = Field(default_factory=dict)
    project: ProjectSettings = Field(default_factory=ProjectSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    storage: StorageSettings
    nodes: list[NodeSettings] = Field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    ci: CiSettings | None = None
    controller: ControllerSettings | None = None  # issue 43: components/controller.py
    # Shared capacity (docs/teams.md): the project's TPU quota, the teams a
    # platform stack serves, budgets; or, in a team stack, the platform stack.
    quota: dict[str, dict[str, ProjectChips]] = Field(default_factory=dict)
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    billing: BillingSettings | None = None
    team_projects: TeamProjectsSettings | None = None
    platform_stack: str | None = None
    # A team stack on a shared gs:// backend: the platform's state bucket, where the
    # platform writes this team's outputs (model/team_state.py outputs_object); the
    # team stack reads them there instead of the platform's whole stack file.
    platform_outputs_bucket: str | None = None
    alerts: AlertsSettings | None = None  # the stack's own alerts (a standalone stack's)
    shared_reservations: list[SharedReservationSettings] = Field(default_factory=list)

    @field_validator("platform_stack", "platform_outputs_bucket", mode="before")
    @classmethod
    def _no_platform_stack(cls, value: Any) -> Any:
        return None if value == "" else value  # Pulumi.yaml's default: none

    @cached_property
    def naming(self) -> Naming:
        return Naming(self.gcp_project, self.stack)

    @property
    def is_team_stack(self) -> bool:
        """A team's own stack, consuming a platform stack through a StackReference."""
        return self.platform_stack is not None

    @cached_property
    def platform_naming(self) -> Naming:
        """Names of the platform stack's shared resources (its data bucket, node tag)."""
        stack = self.platform_stack.rsplit("/", 1)[-1] if self.platform_stack else self.stack
        return Naming(self.gcp_project, stack)

    @property
    def billing_account(self) -> str | None:
        return self.billing.account if self.billing else self.project.billing_account

    @property
    def team_billing_account(self) -> str | None:
        """The billing account of the teams' projects."""
        explicit = self.team_projects.billing_account if self.team_projects else None
        return explicit or (self.billing.account if self.billing else None)

    def team_labels(self, team: str) -> dict[str, str]:
        """A team's extra labels: the stack's, overridden by the team's own."""
        return {**self.labels, **self.teams[team].labels}

    @property
    def all_nodes(self) -> list[tuple[str, NodeSettings]]:
        """Every node the stack declares, with the team that owns it."""
        owned = [(self.team, node) for node in self.nodes]
        return owned + [(team, node) for team, t in self.teams.items() for node in t.nodes]

    @property
    def named_nodes(self) -> list[tuple[str | None, NodeSettings]]:
        """(team in the node's GCP names, node), as platform.py places them: a
        stack's own nodes carry no team, except in a team stack; a platform's
        team nodes carry their team."""
        own_team = self.team if self.is_team_stack else None
        own = [(own_team, node) for node in self.nodes]
        return own + [(team, node) for team, t in self.teams.items() for node in t.nodes]

    def job(self, name: str) -> JobConfig:
        return JobConfig.from_dict(self.jobs[name], resolved=False)

    @property
    def node_jobs(self) -> list[tuple[NodeSettings, JobConfig]]:
        """Every node the stack declares with the job it runs (a team's node, its team's job)."""
        own = [(node, self.job(node.job)) for node in self.nodes]
        return own + [(node, t.job(node.job)) for t in self.teams.values() for node in t.nodes]

    def node_project(self, team: str | None) -> str:
        """The project a node lives in, for `named_nodes`' team: a team's nodes are
        in the team's own project (docs/teams.md), the stack's own in gcp:project."""
        return self.naming.team_project(team) if team is not None else self.gcp_project

    @property
    def regions(self) -> list[str]:
        """Regions that need a subnet: every node's, and every region with
        granted quota (a team stack's nodes use the platform's subnets)."""
        regions = {catalog.region_of(c.zone) for _, node in self.all_nodes
                   for c in node.candidates}
        return sorted(regions | {r for by_region in self.quota.values() for r in by_region})

    @property
    def zones(self) -> list[str]:
        return sorted({node.zone for _, node in self.all_nodes})
