"""The stack config, typed and checked: the only place a rule about it lives.

`load_settings(raw)` takes the config as the Pulumi CLI hands it to the program
(`tpu-stack:<key>` → value) and returns a `StackSettings`, or raises one
`SettingsError` that lists every problem with its key path and what is allowed,
e.g. `tpu-stack:nodes[0].topology: 3x3 is not a v5e topology (1x1, 2x2, …)`.

Two passes: pydantic checks shape and types (unknown keys refused), then plain
functions check what depends on several values or on the catalog. Both run on
every file: where pydantic refuses a part, a copy with that part taken out (an
unknown key, an invalid optional value back to its default, a list entry) or a
blank in its place (a required value) still goes through the rules, so one
message lists every problem, never one kind after another.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import json
import re
import types
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic.alias_generators import to_camel

from model import budget_hold, catalog, subnets
from model.gcs_locations import gcs_locations
from model.naming import (
    LOGICAL_NAME_RE,
    LOGICAL_NAME_RULE,
    Naming,
    label_key_problem,
    label_value_problem,
)
from tpu_training.config import JobConfig, JobConfigError, train_device_bytes

NAMESPACE = "tpu-stack"
GCP_PROJECT_KEY = "gcp:project"

Provisioning = Literal["on-demand", "spot", "preemptible", "reserved", "queued"]
Environment = Literal["dev", "prod"]
Capacity = Literal["onDemand", "spot", "reserved"]
Commitment = Literal["1-year", "3-year"]  # catalog.COMMITMENTS
QuotaType = Literal["onDemand", "preemptible"]

# cloud.google.com/resource-manager/docs/creating-managing-projects: 6-30
# characters, lowercase letters, digits and hyphens, starting with a letter.
_PROJECT_ID_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# cloud.google.com/billing/docs/how-to/find-billing-account-id: XXXXXX-XXXXXX-XXXXXX.
_BILLING_RE = re.compile(r"^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_DURATION_RE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>[smhd])$")
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
        seconds = _duration_seconds(self.valid_until_duration)
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
        return _duration_seconds(self.max_runtime)

    @property
    def idle_stop_seconds(self) -> int | None:
        return _duration_seconds(self.idle_stop)

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
        seconds = _duration_seconds(self.max_wait or DEFAULT_MAX_WAIT)
        assert seconds is not None, "checked by _fallback_problems"
        return seconds

    @property
    def workers(self) -> str:
        """`tpu-stack-workers`: every worker runs a client, or worker 0 only
        (pod slices run one TF client; docs/tpu-facts.md, "TensorFlow on TPU")."""
        return "0" if self.tpu.multi_host else "all"


def _duration_seconds(text: str | None) -> int | None:
    """A duration's seconds; None when absent or not a duration (the rules say so)."""
    match = _DURATION_RE.match(text or "")
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


class _TeamQuotaBase(_Model):
    usd_per_hour: float | None = Field(default=None, gt=0)

    def chips(self, family: str) -> TeamChips:
        return getattr(self, family)


# `tpu-stack:teams.<team>.quota`: one TeamChips per TPU family the catalog
# knows (so `quota.v5e.spot` is a key path and an unknown family is refused),
# and an optional USD-per-hour ceiling at list prices.
TeamQuota = create_model(  # type: ignore[call-overload]
    "TeamQuota", __base__=_TeamQuotaBase,
    **{family: (TeamChips, Field(default_factory=TeamChips, alias=family))
       for family in catalog.GENERATIONS},
)


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


ENVIRONMENT_KEY = f"{NAMESPACE}:environment"
ENVIRONMENTS: tuple[str, ...] = get_args(Environment)


def environment_of(config: Mapping[str, Any]) -> str:
    """dev or prod: decided by `tpu-stack:environment` alone (Pulumi.yaml's
    default: prod), here and in the policy pack. A value load_settings would
    refuse counts as prod, the stricter one."""
    value = config.get(ENVIRONMENT_KEY)
    return value if value in ENVIRONMENTS else StackSettings.model_fields["environment"].default


# Keys of the stack config the program reads, with the model field each fills.
TOP_LEVEL_KEYS: dict[str, str] = {
    f"{NAMESPACE}:{to_camel(name)}": name
    for name in StackSettings.model_fields if name not in ("stack", "gcp_project", "organization")
}


def load_settings(raw: Mapping[str, Any], stack: str,
                  organization: str | None = None) -> StackSettings:
    """Check the config `raw` (`namespace:key` → value, as the CLI passes it) of
    `stack` in `organization` (None: unknown, e.g. offline). Every problem of the
    file at once: its shape's and its rules' (module docstring)."""
    data, problems = _gather(raw, stack)
    data["organization"] = organization
    try:
        settings = StackSettings.model_validate(data)
    except ValidationError as error:
        shape = _pydantic_problems(error)
        problems += shape + _rules_despite(data, error, _suggested_keys(problems + shape))
        raise SettingsError(with_suggestions(problems)) from None
    problems += list(_rule_problems(settings))
    if problems:
        raise SettingsError(with_suggestions(problems))
    return settings


_UNKNOWN = "unknown key; allowed: "


def _closest(name: str, allowed: list[str]) -> str | None:
    """The allowed word `name` most likely misspells (difflib), or None."""
    match = difflib.get_close_matches(name, allowed, n=1)
    return match[0] if match else None


def _suggested_keys(problems: list[tuple[str, str]]) -> set[str]:
    """The keys an unknown key's "did you mean" points to."""
    suggested = set()
    for key, message in problems:
        if message.startswith(_UNKNOWN):
            parent, _, name = key.rpartition(".")
            match = _closest(name, message[len(_UNKNOWN):].split(", "))
            if match:
                suggested.add(f"{parent}.{match}" if parent else match)
    return suggested


def with_suggestions(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A misspelt key is one problem with a "did you mean": the unknown key gets
    the closest allowed one (difflib), and that key's own "is required" goes."""
    suggested = _suggested_keys(problems)
    out = []
    for key, message in problems:
        if message.startswith(_UNKNOWN):
            name = key.rpartition(".")[2]
            allowed = message[len(_UNKNOWN):].split(", ")
            match = _closest(name, allowed)
            if match:
                message = f"unknown key; did you mean {match}? allowed: {', '.join(allowed)}"
        out.append((key, message))
    return [(key, message) for key, message in out
            if not (key in suggested and message.startswith("is required"))]


def _gather(raw: Mapping[str, Any], stack: str) -> tuple[dict[str, Any], list]:
    problems: list[tuple[str, str]] = []
    data: dict[str, Any] = {"stack": stack}
    if raw.get(GCP_PROJECT_KEY):
        data["gcpProject"] = raw[GCP_PROJECT_KEY]
    for key, value in raw.items():
        namespace, _, name = key.partition(":")
        if namespace != NAMESPACE:
            continue
        if key not in TOP_LEVEL_KEYS:
            problems.append((key, f"unknown key; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}"))
            continue
        decoded = _decode(value)
        # An empty block ({} or null, e.g. a Pulumi.yaml default) is no block.
        if decoded not in ({}, None, "null"):
            data[name] = decoded
    return data, problems


def _decode(value: Any) -> Any:
    """Pulumi hands object and array values to the program as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _key_path(loc: tuple[int | str, ...]) -> str:
    head, *rest = loc
    path = GCP_PROJECT_KEY if head == "gcpProject" else f"{NAMESPACE}:{head}"
    for part in rest:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _pydantic_problems(error: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        if item["type"] == "extra_forbidden":
            message = f"unknown key; allowed: {_allowed_keys(loc[:-1])}"
        elif item["type"] == "missing":
            message = f"is required{_required_inside(loc)}"
        else:
            message = f"{item['msg']}, got {item.get('input')!r}"
        problems.append((_key_path(loc), message))
    return problems


def _allowed_keys(parent: tuple[int | str, ...]) -> str:
    model = _model_at(parent)
    return ", ".join(_key_of(n, f) for n, f in model.model_fields.items())


def _required_inside(loc: tuple[int | str, ...]) -> str:
    """', with location' for a missing block that has keys of its own to give."""
    model = _model_at(loc)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    required = [_key_of(n, f) for n, f in model.model_fields.items() if f.is_required()]
    return f", with at least {', '.join(required)}" if required else ""


def _model_at(path: tuple[int | str, ...]) -> Any:
    model: Any = StackSettings
    for part in path:
        if isinstance(part, int) or not hasattr(model, "model_fields"):
            continue
        field = next((f for n, f in model.model_fields.items() if _key_of(n, f) == part), None)
        if field is not None:  # else a key of a dict (a team or family name)
            model = _model_of(field.annotation)
    return model


def _key_of(name: str, field: Any) -> str:
    return field.alias or to_camel(name)


def _model_of(annotation: Any) -> Any:
    for candidate in getattr(annotation, "__args__", ()) or (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        inner = _model_of(candidate) if getattr(candidate, "__args__", None) else None
        if inner is not None:
            return inner
    return annotation


# ---- the rules despite shape problems ---------------------------------------

Loc = tuple[int | str, ...]  # a pydantic error location: keys and list indices
_DROPPED = object()  # a list entry taken out, until the list is compacted
_REPAIR_ROUNDS = 4  # a blank block can only reveal its own required keys


def _rules_despite(data: dict[str, Any], error: ValidationError,
                   suggested: set[str]) -> list[tuple[str, str]]:
    """The rule problems of `data`, which pydantic refused with `error`: the rules
    run on a repaired copy (`_Repair`), and what they say about a repaired part,
    or about a key an unknown key was probably meant to be, is left out: that part
    has its own problem already. [] when no copy validates."""
    repair = _Repair(copy.deepcopy(data))
    for _ in range(_REPAIR_ROUNDS):
        if not repair.apply(error):
            return []
        try:
            settings = StackSettings.model_validate(repair.data)
            break
        except ValidationError as again:
            error = again
    else:
        return []
    try:
        found = list(_rule_problems(settings))
    except Exception:  # a rule that cannot read a repaired copy: the shape problems only
        return []
    # A key an unknown key probably meant, and that the file lacks: its value is
    # under the misspelt key, so the rules' word about it is not news.
    meant = {key for key in suggested if not _present(data, key)}
    return [(key, message) for key, message in ((repair.original_key(k), m) for k, m in found)
            if key not in meant and not any(_about(key, message, done)
                                            for done in repair.keys)]


def _present(data: dict[str, Any], key: str) -> bool:
    """Whether the key path `key` (tpu-stack:nodes[0].zone) is set in `data`."""
    value: Any = data
    path = key.split(":", 1)[1] if key.startswith(f"{NAMESPACE}:") else key
    for part in re.findall(r"[^.\[\]]+", path):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return False
    return True


def _about(key: str, message: str, repaired: str) -> bool:
    """Whether a rule's problem is at or under a repaired key, or names it (e.g.
    "allowed only with tpu-stack:environment dev"): its own problem says it all."""
    return (key == repaired or key.startswith((f"{repaired}.", f"{repaired}["))
            or re.search(re.escape(repaired) + r"(?![\w.\[-])", message) is not None)


class _Repair:
    """A copy of the config made valid part by part: an unknown key or dict entry
    goes, an invalid optional value goes (its default applies), an invalid required
    string or block becomes blank, and what cannot be repaired in place goes with
    the nearest list entry holding it. Keeps where list entries were, so the rules'
    key paths name the file's entries."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.keys: list[str] = []  # the repaired parts, as key paths of the file
        self._origin: dict[Loc, list[int]] = {}  # a shortened list's original indices

    def apply(self, error: ValidationError) -> bool:
        """Repair every location `error` names; False when one cannot be."""
        for item in error.errors():
            loc = tuple(item["loc"])
            if not self._repair(loc):
                return False
            self.keys.append(_key_path(self._original(loc)))
        self._compact(self.data, ())
        return True

    def _repair(self, loc: Loc) -> bool:
        kind, required, annotation = _slot(loc)
        if kind == "field" and required:
            blank = _blank(annotation)
            if blank is not None:
                return self._set(loc, blank)
        for end in range(len(loc), 0, -1):
            kind, required, _ = _slot(loc[:end])
            if kind in ("extra", "item", "entry") or (kind == "field" and not required):
                return self._set(loc[:end], _DROPPED)
        return False

    def _set(self, loc: Loc, value: Any) -> bool:
        parent: Any = self.data
        for part in loc[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                return True  # already gone with an enclosing part
        last = loc[-1]
        if isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent[last] = value
        elif isinstance(parent, dict):
            if value is _DROPPED:
                parent.pop(last, None)
            else:
                parent[last] = value
        return True

    def _compact(self, value: Any, loc: Loc) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                self._compact(inner, (*loc, key))
        elif isinstance(value, list):
            kept = [index for index, inner in enumerate(value) if inner is not _DROPPED]
            if len(kept) < len(value):
                origin = self._origin.get(loc, list(range(len(value))))
                self._origin[loc] = [origin[index] for index in kept]
                value[:] = [value[index] for index in kept]
            for index, inner in enumerate(value):
                self._compact(inner, (*loc, index))

    def _original(self, loc: Loc) -> Loc:
        """`loc` in the file's list indices."""
        out: list[int | str] = []
        for part in loc:
            origin = self._origin.get(tuple(loc[:len(out)]))
            out.append(origin[part] if isinstance(part, int) and origin
                       and part < len(origin) else part)
        return tuple(out)

    def original_key(self, key: str) -> str:
        """A rule's key path in the file's list indices."""
        for loc, origin in self._origin.items():
            prefix = re.escape(_key_path(loc)) + r"\[(\d+)\]"
            key = re.sub(f"^{prefix}", lambda m, loc=loc, origin=origin:
                         f"{_key_path(loc)}[{origin[int(m[1])]}]", key)
        return key


def _slot(loc: Loc) -> tuple[str, bool, Any]:
    """What the last part of `loc` is in StackSettings: ("field", required,
    annotation) of a model, ("item" | "entry", False, annotation) of a list or a
    dict, ("extra", False, None) for a key no model has."""
    annotation: Any = StackSettings
    kind, required = "field", True
    for part in loc:
        annotation = _unwrap_optional(annotation)
        origin = get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for n, f in annotation.model_fields.items()
                          if _key_of(n, f) == part), None)
            if field is None:
                return "extra", False, None
            kind, required, annotation = "field", field.is_required(), field.annotation
        elif origin is list:
            kind, required, annotation = "item", False, get_args(annotation)[0]
        elif origin is dict:
            kind, required, annotation = "entry", False, get_args(annotation)[1]
        else:
            return "extra", False, None
    return kind, required, annotation


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def _blank(annotation: Any) -> Any:
    """A stand-in for a required value: an empty string, or a block whose own
    required keys the next round fills; None for other types."""
    if annotation is str:
        return ""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {}
    return None


# ---- rules that need several values or the catalog -------------------------

Problems = Iterator[tuple[str, str]]


def _rule_problems(s: StackSettings) -> Problems:
    yield from _project_problems(s)
    yield from _storage_problems(s)
    yield from _labels_problems(f"{NAMESPACE}:labels", s.labels)
    network = list(_network_problems(s))
    yield from network
    if not network:
        yield from _moved_range_problems(s)
    yield from _jobs_problems(f"{NAMESPACE}:jobs", s.jobs)
    yield from _node_list_problems(f"{NAMESPACE}:nodes", s.nodes, s.jobs, f"{NAMESPACE}:jobs")
    if s.ci:
        yield from _ci_problems(s.ci)
    yield from team_problems(s)


def _project_problems(s: StackSettings) -> Problems:
    if not _PROJECT_ID_RE.match(s.gcp_project):
        yield (GCP_PROJECT_KEY, f"{s.gcp_project!r} is not a project id: 6-30 lowercase "
                                f"letters, digits or hyphens, starting with a letter")
    key = f"{NAMESPACE}:project"
    p = s.project
    if p.create and not p.billing_account:
        yield (f"{key}.billingAccount", "is required when create is true")
    if p.billing_account and not _BILLING_RE.match(p.billing_account):
        yield (f"{key}.billingAccount", f"{p.billing_account!r} is not a billing account "
                                        f"id (XXXXXX-XXXXXX-XXXXXX, hex digits)")
    for field in ("folder_id", "org_id"):
        value = getattr(p, field)
        if value is not None and not value.isdigit():
            yield (f"{key}.{to_camel(field)}", f"{value!r} must be digits only")
    if p.folder_id and p.org_id:
        yield (f"{key}.folderId", "give folderId or orgId, not both")
    if not p.create and (p.billing_account or p.folder_id or p.org_id):
        yield (f"{key}.create", "billingAccount, folderId and orgId apply only with create: true")


def _storage_problems(s: StackSettings) -> Problems:
    key = f"{NAMESPACE}:storage"
    problem = location_problem(s.storage.location)
    if problem:
        yield (f"{key}.location", problem)
    # docs/design.md: prod data is never lost by a command; only dev may opt out.
    if s.environment != "dev":
        if s.storage.force_destroy:
            yield (f"{key}.forceDestroy", f"true is allowed only with "
                                          f"{NAMESPACE}:environment dev (this stack is "
                                          f"{s.environment})")
        if not s.storage.protect:
            yield (f"{key}.protect", f"false is allowed only with {NAMESPACE}:environment "
                                     f"dev (this stack is {s.environment})")


def location_problem(location: str) -> str | None:
    """Why `location` is not a Cloud Storage location, with the closest one
    (model/gcs_locations.json), or None."""
    known = gcs_locations()
    if known.knows(location):
        return None
    meant = _closest(location.lower(), list(known.all()))
    shown = meant if meant in known.regions else (meant or "").upper()
    hint = f" (did you mean {shown}?)" if meant else ""
    return (f"{location!r} is not a Cloud Storage location{hint}: a region (e.g. us-central1), "
            f"a dual-region ({', '.join(d.upper() for d in known.dual_regions)}) or a "
            f"multi-region ({', '.join(m.upper() for m in known.multi_regions)}); the list is "
            f"model/gcs_locations.json, read from {known.source}")


def _labels_problems(key: str, labels: Mapping[str, str]) -> Problems:
    for name, value in labels.items():
        problem = label_key_problem(name) or label_value_problem(value)
        if problem:
            yield (f"{key}.{name}", problem)


def _network_problems(s: StackSettings) -> Problems:
    key = f"{NAMESPACE}:network"
    grid = s.network.subnet_cidr
    problem = _range_problem(grid)
    if problem:
        yield (f"{key}.subnetCidr", problem)
        return
    regions = sorted({catalog.region_of(zone) for zone in catalog.all_zones()})
    pinned: dict[str, ipaddress.IPv4Network] = {}
    for region, cidr in sorted(s.network.subnets.items()):
        problem = (_range_problem(cidr) if region in regions else
                   f"{region!r} is not a region with TPUs{_did_you_mean(region, regions, ())} "
                   f"({', '.join(regions)})")
        net = None if problem else ipaddress.IPv4Network(cidr)
        clash = net and next((f"{other}'s {pin}" for other, pin in pinned.items()
                              if pin.overlaps(net)), None)
        if problem or clash:
            yield (f"{key}.subnets.{region}", problem or f"{region}'s range {net} overlaps "
                                                         f"{clash}")
        else:
            pinned[region] = net
    # The others take grid blocks, which overlap no pin (model/subnets.py). A
    # region with no TPUs comes from a zone or quota region already refused under
    # its own key: one message for the mistake, not a second about its slot.
    pins = {region: str(net) for region, net in pinned.items()}
    for region in sorted(set(s.regions) & set(regions) - set(s.network.subnets)):
        try:
            cidr = subnets.subnet_ranges(grid, [region], pins)[region]
        except subnets.SubnetRangeError as error:
            yield (f"{key}.subnetCidr", str(error))
            continue
        problem = _range_problem(cidr)
        if problem:
            yield (f"{key}.subnetCidr", f"{region}'s slot range {cidr}: {problem}; pin "
                                        f"{region} to a range in {key}.subnets")


def _moved_range_problems(s: StackSettings) -> Problems:
    """Every unpinned region in use sits in its own slot's block (model/subnets.py),
    so adding a pin never moves a range: a pin over such a block would move that region's
    subnet, a replacement, delete first, of the subnet and every node on it
    (resource_compute_subnetwork.go IsShrinkageIpCidr; docs/design.md, "Stack config").
    The settings cannot tell a region in use from one added with the pin, so both are
    refused and the message says how to pin either."""
    key = f"{NAMESPACE}:network"
    grid, pins = s.network.subnet_cidr, s.network.subnets
    ranges = subnets.grid_ranges(grid, pins)
    for region in sorted(set(s.regions) - set(pins)):
        home, actual = subnets.slot_range(grid, region), ranges.get(region)
        if home is None or actual is None or home == actual:
            continue
        net = ipaddress.IPv4Network(home)
        pin = next((p for p, cidr in sorted(pins.items())
                    if ipaddress.IPv4Network(cidr).overlaps(net)), None)
        by = f"{pin}'s pin {pins[pin]}" if pin else "a range moved by a pin before it"
        yield (f"{key}.subnets.{pin}" if pin else f"{key}.subnets",
               f"{by} overlaps {region}'s slot range {home}, so {region}'s subnet would move "
               f"to {actual}: a replacement, delete first, of the subnet and every node on "
               f"it. If {region} has a subnet already, pin it where it is ({key}.subnets."
               f"{region}: {home}) and give {pin or 'the pin'} a range outside it; for a new "
               f"{region}, pin it to {actual}.")


# RFC 1918's private IPv4 space; cloud.google.com/vpc/docs/subnets#valid-ranges:
# a subnet's primary range is /29 or larger.
_RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                    "192.168.0.0/16"))


def _range_problem(cidr: str) -> str | None:
    """Why `cidr` cannot be a subnet's primary range, or None."""
    try:
        network = ipaddress.IPv4Network(cidr)
    except ValueError:
        return f"{cidr!r} is not an IPv4 CIDR range, e.g. 10.128.0.0/20"
    if not any(network.subnet_of(block) for block in _RFC1918) or network.prefixlen > 29:
        return (f"{network} must be a private range (RFC 1918: 10.0.0.0/8, 172.16.0.0/12, "
                f"192.168.0.0/16) of /29 or larger")
    return None


def _job_configs(jobs: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, JobConfig]]:
    for name, data in jobs.items():
        try:
            yield name, JobConfig.from_dict(data, resolved=False)
        except JobConfigError:
            continue


def _jobs_problems(key: str, jobs: Mapping[str, Mapping[str, Any]]) -> Problems:
    """Every job of a `jobs` block (`key`: its path, top-level or a team's)."""
    for name, data in jobs.items():
        if not LOGICAL_NAME_RE.match(name):
            yield (f"{key}.{name}", f"job names are {LOGICAL_NAME_RULE}")
        try:
            JobConfig.from_dict(data, resolved=False)
        except JobConfigError as error:
            for field, message in error.problems:
                yield (f"{key}.{name}" + (f".{field}" if field else ""), message)


def _node_list_problems(key: str, nodes: list[NodeSettings],
                        job_data: Mapping[str, Mapping[str, Any]], jobs_key: str) -> Problems:
    """Every node of a `nodes` list (`key`) whose jobs are `job_data` (at `jobs_key`)."""
    jobs = dict(_job_configs(job_data))
    seen: dict[str, int] = {}
    for index, node in enumerate(nodes):
        node_key = f"{key}[{index}]"
        if node.name in seen:
            yield (f"{node_key}.name",
                   f"{node.name!r} is already the name of nodes[{seen[node.name]}]")
        seen.setdefault(node.name, index)
        yield from node_problems(node_key, node, job_data, jobs, jobs_key)


def node_problems(key: str, node: NodeSettings, job_names: Mapping[str, Any],
                  jobs: Mapping[str, JobConfig], jobs_key: str = f"{NAMESPACE}:jobs") -> Problems:
    """Every rule of one node; `key` is its path in the config, `jobs_key` the
    path of the jobs it may name."""
    if not LOGICAL_NAME_RE.match(node.name):
        yield (f"{key}.name", f"{node.name!r}: node names are {LOGICAL_NAME_RULE}")
    yield from _labels_problems(f"{key}.labels", node.labels)
    yield from _queue_problems(key, node)
    yield from _commitment_problems(key, node)
    yield from _fallback_problems(key, node)
    yield from _limit_problems(key, node)
    slice_problems = list(_slice_problems(key, node))
    if slice_problems:
        yield from slice_problems
        return
    tpu = node.tpu
    yield from _zone_problems(key, node, tpu)
    yield from _runtime_problems(key, node, tpu)
    if node.job not in job_names:
        allowed = ", ".join(job_names) or "none defined"
        yield (f"{key}.job", f"{node.job!r} is not a key of {jobs_key} ({allowed})")
    elif node.job in jobs:
        yield from _batch_problems(key, node, tpu, jobs[node.job], jobs_key)
        yield from _hbm_problems(key, tpu, jobs[node.job], f"{jobs_key}.{node.job}")


def _slice_problems(key: str, node: NodeSettings) -> Problems:
    by_type = node.accelerator_type is not None
    by_shape = node.generation is not None or node.topology is not None
    if by_type and by_shape:
        yield (f"{key}.acceleratorType", "give acceleratorType or generation + topology, "
                                         "not both")
        return
    if not by_type and not by_shape:
        yield (f"{key}.acceleratorType", "give acceleratorType (e.g. v2-8) or generation + "
                                         "topology (e.g. v4 + 2x2x4)")
        return
    try:
        if by_type:
            catalog.parse_accelerator_type(node.accelerator_type or "")
            return
        if node.generation is None or node.topology is None:
            missing = "generation" if node.generation is None else "topology"
            yield (f"{key}.{missing}", "is required with "
                   f"{'topology' if missing == 'generation' else 'generation'}")
            return
        gen = catalog.generation(node.generation)
    except catalog.CatalogError as error:
        field = "acceleratorType" if by_type else "generation"
        yield (f"{key}.{field}", str(error))
        return
    problem = catalog.topology_problem(gen, node.topology)
    if problem:
        yield (f"{key}.topology", problem)


def _zone_problems(key: str, node: NodeSettings, tpu: catalog.Slice) -> Problems:
    gen = tpu.generation
    if not _ZONE_RE.match(node.zone):
        yield (f"{key}.zone", f"{node.zone!r} is not a zone name: "
                              f"{catalog.zone_suggestion(gen, node.zone)}")
    elif node.zone not in gen.zones:
        yield (f"{key}.zone", f"{node.zone} does not offer TPU {gen.name}"
                              f"{_did_you_mean(node.zone, gen.zones, catalog.all_zones())} "
                              f"({', '.join(gen.zones)})")


def _did_you_mean(name: str, allowed: tuple[str, ...] | list[str],
                  known: tuple[str, ...] | set[str]) -> str:
    """`; did you mean <the allowed name closest to name>?` for a name that is none of
    the `known` ones (a misspelling), else "": a real zone that lacks the TPU is no typo."""
    if name in known:
        return ""
    meant = _closest(name, list(allowed))
    return f"; did you mean {meant}?" if meant else ""


def _runtime_problems(key: str, node: NodeSettings, tpu: catalog.Slice) -> Problems:
    if node.runtime_version is None:
        if catalog.runtime_for(tpu) is None:
            yield (f"{key}.runtimeVersion", catalog.runtime_problem(tpu, "") or "")
        return
    problem = catalog.runtime_problem(tpu, node.runtime_version)
    if problem:
        yield (f"{key}.runtimeVersion", problem)


def _batch_problems(key: str, node: NodeSettings, tpu: catalog.Slice,
                    job: JobConfig, jobs_key: str) -> Problems:
    if job.globalBatchSize % tpu.replicas:
        yield (f"{jobs_key}.{node.job}.globalBatchSize",
               f"{job.globalBatchSize} is not divisible by the {tpu.replicas} replicas of "
               f"{key} ({tpu.accelerator_type}); use a multiple of {tpu.replicas}")


def _hbm_problems(key: str, tpu: catalog.Slice, job: JobConfig, job_key: str) -> Problems:
    """A batch whose replica share cannot fit one replica's HBM (catalog: HBM per chip
    over the replicas a chip runs). The need is a lower bound (`train_device_bytes`:
    weights and optimizer state, activations with the attention scores recomputed), so
    what is refused cannot fit; what passes may still need a smaller batch."""
    replicas = tpu.replicas
    need = train_device_bytes(job, job.globalBatchSize // replicas)
    if need is None or job.globalBatchSize % replicas:
        return
    gen = tpu.generation
    have = gen.hbm_gib_per_chip * 2**30 / gen.replicas_per_chip
    if need <= have:
        return
    fixed = train_device_bytes(job, 0) or 0
    per_example = (train_device_bytes(job, 1) or 0) - fixed
    fits = max(0, int((have - fixed) // per_example)) * replicas
    advice = f"use a globalBatchSize of at most {fits}" if fits else \
        "its weights and optimizer state alone do not fit"
    yield (f"{job_key}.globalBatchSize",
           f"{job.globalBatchSize} is {job.globalBatchSize // replicas} examples per replica "
           f"on {key} ({tpu.accelerator_type}, {replicas} replicas); {job.model} at "
           f"maxSeqLength {job.maxSeqLength} needs at least {need / 2**30:.1f} GiB of HBM for "
           f"them, and a {gen.name} chip has {gen.hbm_gib_per_chip} GiB ({_hbm_share(gen)}, "
           f"cloud.google.com/tpu/docs/{gen.name}): {advice}, or a larger slice")


def _hbm_share(gen: catalog.Generation) -> str:
    if gen.replicas_per_chip == 1:
        return "one replica per chip"
    return f"{gen.hbm_gib_per_chip // gen.replicas_per_chip} GiB per replica, " \
           f"{gen.replicas_per_chip} per chip"


def _queue_problems(key: str, node: NodeSettings) -> Problems:
    queue = node.queue
    if queue is None:
        return
    if node.provisioning != "queued":
        yield (f"{key}.queue", f"applies only with provisioning: queued "
                               f"(this node is {node.provisioning})")
        return
    if queue.spot and queue.guaranteed:
        yield (f"{key}.queue.spot", "a queued resource is spot or guaranteed, not both")
    if queue.reservation_name and queue.spot:
        yield (f"{key}.queue.reservationName", "a reservation cannot be spot capacity")
    if queue.valid_until_duration and not _DURATION_RE.match(queue.valid_until_duration):
        yield (f"{key}.queue.validUntilDuration", f"{queue.valid_until_duration!r} is not a "
                                                  f"duration: a number and s, m, h or d "
                                                  f"(e.g. 6h)")


def _commitment_problems(key: str, node: NodeSettings) -> Problems:
    """A Cloud TPU commitment is a future reservation with a 1- or 3-year committed use
    discount attached (cloud.google.com/tpu/docs/long-term-reservation): a node runs
    under it by consuming that reservation, never as spot capacity."""
    if node.commitment is not None and node.capacity != "reserved":
        yield (f"{key}.commitment", f"{node.commitment} applies to reserved capacity only (a "
                                    f"future reservation with a committed use discount, "
                                    f"cloud.google.com/tpu/docs/long-term-reservation); this "
                                    f"node is {node.provisioning}: use provisioning: reserved, "
                                    f"or a queue with a reservationName")


def _fallback_problems(key: str, node: NodeSettings) -> Problems:
    """`fallback`, `maxWait`, `allowCostlier` (docs/design.md, "Capacity that finds
    itself"): each candidate is checked as a node of its own, at its own key."""
    if node.max_wait is not None and not _DURATION_RE.match(node.max_wait):
        yield (f"{key}.maxWait", f"{node.max_wait!r} is not a duration: a number and s, m, "
                                 f"h or d (e.g. 30m, 20s)")
    if not node.fallback:
        if node.max_wait is not None:
            yield (f"{key}.maxWait", "applies only with fallback (how long a request waits "
                                     "before the next candidate is tried)")
        if node.allow_costlier:
            yield (f"{key}.allowCostlier", "applies only with fallback")
        return
    yield from _queueable_problems(f"{key}.provisioning", node)
    if list(_slice_problems(key, node)):
        return  # the node's own problem says it; nothing to compare the candidates with
    own_price = _hourly(node)
    seen: dict[tuple[Any, ...], str] = {_placement(node): "the node's own placement"}
    for index, candidate in enumerate(node.candidates[1:]):
        entry_key = f"{key}.fallback[{index}]"
        problems = list(_candidate_problems(entry_key, candidate))
        yield from problems
        if problems:
            continue
        placement = _placement(candidate)
        if placement in seen:  # under .zone: a misspelt zone key's own problem says it
            yield (f"{entry_key}.zone", f"the same placement as {seen[placement]}: "
                                        f"{_label(candidate)}")
            continue
        seen[placement] = f"{key}.fallback[{index}]"
        price = _hourly(candidate)
        if (not node.allow_costlier and own_price is not None and price is not None
                and price > own_price + 1e-9):
            yield (entry_key, f"{_label(candidate)} costs ${price:.2f}/h, more than the node's "
                              f"own ${own_price:.2f}/h: set allowCostlier: true on the node "
                              f"to allow it")


def _queueable_problems(key: str, node: NodeSettings) -> Problems:
    """With fallback every candidate is a queued resource (components/fallback_tpu.py),
    whose tiers are spot, guaranteed, a reservation by name, or none: on demand
    (google-cloud-tpu 1.27 QueuedResource). Legacy preemptible and a reserved node
    without a reservation's name have no queued form."""
    if node.provisioning in ("preemptible", "reserved"):
        instead = "spot" if node.provisioning == "preemptible" else \
            "queued with queue.reservationName"
        yield (key, f"{node.provisioning} cannot be a candidate of a node with fallback (each "
                    f"candidate is a queued resource): use {instead}")


def _candidate_problems(key: str, candidate: NodeSettings) -> Problems:
    yield from _queueable_problems(f"{key}.provisioning", candidate)
    yield from _queue_problems(key, candidate)
    slice_problems = list(_slice_problems(key, candidate))
    if slice_problems:
        yield from slice_problems
        return
    tpu = candidate.tpu
    yield from _zone_problems(key, candidate, tpu)
    if not _ZONE_RE.match(candidate.zone) or candidate.zone not in tpu.generation.zones:
        return
    region = catalog.region_of(candidate.zone)
    if region not in subnets.REGION_SLOTS:
        yield (f"{key}.zone", f"{candidate.zone}: the stack's network has no subnet slot for "
                              f"{region} (model/subnets.py REGION_SLOTS)")
    yield from _runtime_problems(key, candidate, tpu)


def _placement(node: NodeSettings) -> tuple[Any, ...]:
    queue = node.queue.model_dump() if node.queue else None
    return (node.zone, node.tpu.accelerator_type, node.provisioning,
            json.dumps(queue, sort_keys=True))


def _label(node: NodeSettings) -> str:
    return f"{node.zone} {node.tpu.accelerator_type} {node.provisioning}"


def _hourly(node: NodeSettings) -> float | None:
    from model.cost import node_cost  # cost imports the settings

    return node_cost(node).usd_per_hour
# The agent looks once a second (node_agent/limits.py): a shorter limit stops at once.
_LEAST_LIMIT_SECONDS = 60


def _limit_problems(key: str, node: NodeSettings) -> Problems:
    """maxRuntime and idleStop are durations of at least a minute."""
    for field, value in (("maxRuntime", node.max_runtime), ("idleStop", node.idle_stop)):
        if value is None:
            continue
        seconds = _duration_seconds(value)
        if seconds is None:
            yield (f"{key}.{field}", f"{value!r} is not a duration: a number and s, m, h or d "
                                     f"(e.g. 30m, 12h, 7d)")
        elif seconds < _LEAST_LIMIT_SECONDS:
            yield (f"{key}.{field}", f"{value} is under a minute: use 1m or more")


_GITHUB_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# A branch name as it follows refs/heads/ (no quotes: it is written into a CEL literal).
_GITHUB_REF_NAME_RE = re.compile(r"^[A-Za-z0-9._/-]+$")
_ENVIRONMENT_RE = re.compile(r"^[A-Za-z0-9._-]+$")
# Workload identity pool and provider ids: 4-32 lowercase letters, digits, dashes
# (cloud.google.com/iam/docs/manage-workload-identity-pools-providers).
_POOL_ID_RE = re.compile(r"^[a-z0-9-]{4,32}$")


def _ci_problems(ci: CiSettings, key: str = f"{NAMESPACE}:ci") -> Problems:
    if not _GITHUB_REPO_RE.match(ci.github_repository):
        yield (f"{key}.githubRepository", f"{ci.github_repository!r} is not owner/name")
    for field in ("github_repository_id", "github_repository_owner_id"):
        if not getattr(ci, field).isdigit():
            yield (f"{key}.{to_camel(field)}", f"{getattr(ci, field)!r} is not a number: GitHub's "
                                               f"numeric id (api.github.com/repos/<owner>/<name>: "
                                               f"`id`, `owner.id`)")
    if not _GITHUB_REF_NAME_RE.match(ci.deploy_branch):
        yield (f"{key}.deployBranch", f"{ci.deploy_branch!r} is not a branch name")
    if ci.deploy_environment is not None and not _ENVIRONMENT_RE.match(ci.deploy_environment):
        yield (f"{key}.deployEnvironment", f"{ci.deploy_environment!r}: letters, digits, "
                                           f"'.', '_' or '-'")
    for field in ("pool_id", "provider_id"):
        value = getattr(ci, field)
        if not _POOL_ID_RE.match(value) or value.startswith("gcp-"):
            yield (f"{key}.{to_camel(field)}", f"{value!r}: 4-32 lowercase letters, digits or "
                                               f"dashes, not starting with gcp-")


# ---- shared capacity: teams, quota, budgets, team stacks (docs/teams.md) ----

TEAMS_KEY = f"{NAMESPACE}:teams"
QUOTA_KEY = f"{NAMESPACE}:quota"
COST_CENTRE = "cost-centre"
DEFAULT_TEAM = StackSettings.model_fields["team"].default
# Google groups and users as IAM writes them (cloud.google.com/iam/docs/
# principal-identifiers): `group:ml-vision@acme.com`, `user:ana@acme.com`.
_MEMBER_RE = re.compile(r"^(group|user):[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
# A StackReference name, <organization>/tpu-stack/<stack>: the platform stack is
# a stack of this project. Stack names: pulumi/pulumi sdk/go/common/tokens/
# stack_name.go, ParseStackName (alphanumerics, -, _, ., at most 100).
_STACK_REF_RE = re.compile(
    rf"^(?P<org>[A-Za-z0-9_.-]+)/{NAMESPACE}/(?P<stack>[A-Za-z0-9_.-]{{1,100}})$")
# pulumi/pulumi pkg/backend/diy/store.go, ParseReference: on a self-managed (DIY)
# backend (pulumi login gs://…, s3://…, file://…) "organization name must be
# 'organization'"; Pulumi Cloud (pkg/backend/httpstate, ParseStackReference)
# takes the stack's own organization.
DIY_ORGANIZATION = "organization"
STACK_REF_FORMS = (f"<your-org>/{NAMESPACE}/<stack> on Pulumi Cloud (e.g. "
                   f"acme/{NAMESPACE}/platform), {DIY_ORGANIZATION}/{NAMESPACE}/<stack> on a "
                   f"self-managed backend (pulumi login gs://…, s3://…, file://…)")
_CAPACITY_WORDS = {"onDemand": "on-demand", "spot": "spot", "reserved": "reserved",
                   "preemptible": "preemptible (spot and preemptible)"}


def team_problems(s: StackSettings) -> Problems:
    """The shared-capacity rules: a team stack's, or a platform stack's teams and quota."""
    if s.is_team_stack:
        yield from _team_stack_problems(s)
        yield from _team_reservation_problems(s, f"{NAMESPACE}:nodes", s.nodes)
        return
    if s.platform_outputs_bucket:
        yield (f"{NAMESPACE}:platformOutputsBucket", "belongs to a team stack (one with "
                                                     f"{NAMESPACE}:platformStack)")
    yield from _quota_declaration_problems(s.quota)
    if s.billing:
        yield from _billing_problems(s.billing)
    if s.teams:
        yield from _team_projects_problems(s)
        yield from _platform_deployer_problems(s)
        yield from _team_subnet_problems(s)
    if s.teams and COST_CENTRE not in s.labels:
        yield (f"{NAMESPACE}:labels.{COST_CENTRE}", f"is required with {TEAMS_KEY}: the "
                                                    f"platform's own resources carry one too")
    for name, team in s.teams.items():
        yield from _team_problems(s, name, team)
        yield from _budget_action_problems(s, name, team)
        yield from _budget_hold_problems(name, team)
    if s.quota:
        yield from project_quota_problems(s.quota, s.all_nodes)


def _team_problems(s: StackSettings, name: str, team: TeamSettings) -> Problems:
    key = f"{TEAMS_KEY}.{name}"
    if not LOGICAL_NAME_RE.match(name):
        yield (key, f"team names are {LOGICAL_NAME_RULE}")
    if name == s.team:
        yield (key, f"{name!r} is this stack's own team ({NAMESPACE}:team); name teams apart")
    if not team.members:
        yield (f"{key}.members", "give at least one member (group:… or user:…)")
    for index, member in enumerate(team.members):
        if not _MEMBER_RE.match(member):
            yield (f"{key}.members[{index}]", f"{member!r} is not a Google group or user: "
                                              f"group:name@domain or user:name@domain")
    yield from _labels_problems(f"{key}.labels", team.labels)
    if team.ci:
        yield from _ci_problems(team.ci, f"{key}.ci")
    yield from _jobs_problems(f"{key}.jobs", team.jobs)
    yield from _node_list_problems(f"{key}.nodes", team.nodes, team.jobs, f"{key}.jobs")
    yield from team_quota_problems(f"{key}.quota", name, team.nodes, team.quota)


def _sized(nodes: list[NodeSettings]) -> list[NodeSettings]:
    """The nodes with a valid slice in a zone that offers it: what quota counts
    (the others have their own problem)."""
    sized = []
    for node in nodes:
        try:
            if node.zone in node.tpu.generation.zones:
                sized.append(node)
        except catalog.CatalogError:
            continue
    return sized


_K = TypeVar("_K")


def _quota_draws(node: NodeSettings, key_of: Callable[[NodeSettings], _K]
                 ) -> dict[_K, tuple[str, int]]:
    """Key → (the node as a quota message names it, chips) for every quota the node may
    hold: its own placement's, and with `fallback` each candidate's, since it may run on
    any one of them (issue 35). A node counts once per key, at its largest candidate
    there. Candidates in a zone without their type are left to their own rule."""
    draws: dict[_K, tuple[str, int]] = {}
    count = len(node.candidates)
    for position, candidate in enumerate(node.candidates, start=1):
        if not _sized([candidate]):
            continue
        shown = node.name if position == 1 else f"{node.name} candidate {position}/{count}"
        key = key_of(candidate)
        if key not in draws or candidate.tpu.chips > draws[key][1]:
            draws[key] = (shown, candidate.tpu.chips)
    return draws


def _chips_detail(nodes: list[tuple[str, int]]) -> str:
    return ", ".join(f"{name} {chips}" for name, chips in nodes)


def team_quota_problems(key: str, team: str, nodes: list[NodeSettings],
                        quota: _TeamQuotaBase) -> Problems:
    """`team`'s nodes against its quota (`key`: the quota's path): chips per
    family and capacity, and the list-price cost per hour against the ceiling."""
    usage: dict[tuple[str, Capacity], list[tuple[str, int]]] = {}
    usd_per_hour = 0.0
    for node in nodes:
        draws = _quota_draws(node, lambda c: (c.tpu.generation.name, c.capacity))
        for family_capacity, shown in draws.items():
            usage.setdefault(family_capacity, []).append(shown)
        usd_per_hour += max((catalog.usd_per_hour(c.tpu, spot=c.spot) or 0.0
                             for c in _sized(node.candidates)), default=0.0)
    for (family, capacity), used in sorted(usage.items()):
        chips = sum(c for _, c in used)
        allowed = quota.chips(family).of(capacity)
        if chips > allowed:
            yield (f"{key}.{family}.{capacity}",
                   f"team {team} needs {chips} {family} {_CAPACITY_WORDS[capacity]} chips "
                   f"(nodes: {_chips_detail(used)}); its quota is {allowed}")
    ceiling = quota.usd_per_hour
    if ceiling is not None and round(usd_per_hour, 4) > ceiling:
        yield (f"{key}.usdPerHour", f"team {team}'s nodes cost ${usd_per_hour:.2f}/h at list "
                                    f"prices; its ceiling is ${ceiling:.2f}/h")


def project_quota_problems(quota: Mapping[str, Mapping[str, ProjectChips]],
                           nodes: list[tuple[str, NodeSettings]]) -> Problems:
    """Every team's nodes together against the project's quota, per family,
    region and quota type."""
    usage: dict[tuple[str, str, QuotaType], dict[str, int]] = {}
    for team, node in nodes:
        draws = _quota_draws(node, lambda c: (c.tpu.generation.name,
                                              catalog.region_of(c.zone), c.quota_type))
        for family_region_type, (_, chips) in draws.items():
            by_team = usage.setdefault(family_region_type, {})
            by_team[team] = by_team.get(team, 0) + chips
    for (family, region, quota_type), by_team in sorted(usage.items()):
        chips = sum(by_team.values())
        declared = quota.get(family, {}).get(region)
        allowed = declared.of(quota_type) if declared else 0
        if chips > allowed:
            granted = (f"the project's quota is {allowed}" if declared else
                       f"no {family} quota is declared in {region}")
            yield (f"{QUOTA_KEY}.{family}.{region}.{quota_type}",
                   f"the teams need {chips} {family} {_CAPACITY_WORDS[quota_type]} chips in "
                   f"{region} ({_chips_detail(sorted(by_team.items()))}); {granted}")


def _quota_declaration_problems(quota: Mapping[str, Mapping[str, ProjectChips]]) -> Problems:
    for family, by_region in quota.items():
        try:
            gen = catalog.generation(family)
        except catalog.CatalogError as error:
            yield (f"{QUOTA_KEY}.{family}", str(error))
            continue
        offered = sorted({catalog.region_of(zone) for zone in gen.zones})
        for region in by_region:
            if region not in offered:
                known = {catalog.region_of(zone) for zone in catalog.all_zones()}
                yield (f"{QUOTA_KEY}.{family}.{region}",
                       f"{family} is not offered in {region}"
                       f"{_did_you_mean(region, offered, known)} (regions: {', '.join(offered)})")


TEAM_PROJECTS_KEY = f"{NAMESPACE}:teamProjects"
# cloud.google.com/resource-manager/docs/creating-managing-folders: a folder id is
# a number (the API names it folders/<number>).
_FOLDER_RE = re.compile(r"^[0-9]{1,20}$")
_EMAIL_RE = re.compile(r"^[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")


# cloud.google.com/storage/docs/buckets#naming (names with dots may reach 222: not here).
_STATE_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$")


def _team_projects_problems(s: StackSettings) -> Problems:
    """Every team gets a project of its own under a folder (docs/teams.md): each
    key still missing is named at once."""
    projects = s.team_projects or TeamProjectsSettings()
    folder = projects.folder_id
    if folder is None:
        yield (f"{TEAM_PROJECTS_KEY}.folderId", f"is required with {TEAMS_KEY}: the number of "
                                                f"the folder (folders/<number>) the bootstrap "
                                                f"step makes each team's project in")
    elif not _FOLDER_RE.match(folder):
        yield (f"{TEAM_PROJECTS_KEY}.folderId", f"{folder!r} is not a folder "
                                                f"id: the number of folders/<number>")
    contact = projects.quota_contact
    if contact is None:
        yield (f"{TEAM_PROJECTS_KEY}.quotaContact", f"is required with {TEAMS_KEY}: an email "
                                                    "Google may contact about a team's quota "
                                                    "request (Cloud Quotas "
                                                    "QuotaPreference.contactEmail)")
    elif not _EMAIL_RE.match(contact):
        yield (f"{TEAM_PROJECTS_KEY}.quotaContact", f"{contact!r} is not an email address")
    account = projects.billing_account or (s.billing.account if s.billing else None)
    if account is None:
        yield (f"{TEAM_PROJECTS_KEY}.billingAccount", f"is required with {TEAMS_KEY} and "
                                                      f"without {NAMESPACE}:billing: the "
                                                      "teams' projects need a billing account")
    elif not _BILLING_RE.match(account):
        yield (f"{TEAM_PROJECTS_KEY}.billingAccount", f"{account!r} is not a billing account "
                                                      f"id (XXXXXX-XXXXXX-XXXXXX, hex digits)")
    state = projects.state_bucket
    if state is not None and not _STATE_BUCKET_RE.match(state):
        yield (f"{TEAM_PROJECTS_KEY}.stateBucket", f"{state!r} is not a bucket name: the name "
                                                   "alone (3-63 of a-z 0-9 - _ .), without gs://")


def _budget_action_problems(s: StackSettings, name: str, team: TeamSettings) -> Problems:
    """A budget that stops TPUs needs a budget in USD and a billing account to hold it."""
    if team.budget_action != "stop":
        return
    key = f"{TEAMS_KEY}.{name}"
    if team.budget_usd_per_month is None:
        yield (f"{key}.budgetUsdPerMonth", "is required with budgetAction: stop (the budget "
                                           "the team's nodes are stopped at, in USD a month)")
    if not s.billing_account:
        yield (f"{key}.budgetAction", f"stop needs a budget: set {NAMESPACE}:billing.account")


def _budget_hold_problems(name: str, team: TeamSettings) -> Problems:
    """liftBudgetHold names a budget interval by its month."""
    lift = team.lift_budget_hold
    if lift is not None and not budget_hold.INTERVAL_RE.match(lift):
        yield (f"{TEAMS_KEY}.{name}.liftBudgetHold", f"{lift!r} is not a budget interval: "
                                                     f"YYYY-MM, e.g. '2026-12'")


def _billing_problems(billing: BillingSettings) -> Problems:
    key = f"{NAMESPACE}:billing"
    if not _BILLING_RE.match(billing.account):
        yield (f"{key}.account", f"{billing.account!r} is not a billing account id "
                                 f"(XXXXXX-XXXXXX-XXXXXX, hex digits)")
    for index, threshold in enumerate(billing.alert_thresholds):
        if threshold <= 0:
            yield (f"{key}.alertThresholds[{index}]", f"{threshold} must be above 0 "
                                                      f"(1.0 = 100% of the budget)")


def _team_stack_problems(s: StackSettings) -> Problems:
    key = f"{NAMESPACE}:platformStack"
    ref = s.platform_stack or ""
    match = _STACK_REF_RE.match(ref)
    if not match:
        yield (key, f"{ref!r} is not a stack reference: {STACK_REF_FORMS}")
    elif match["stack"] == s.stack:
        yield (key, f"{ref!r} is this stack itself; name the platform stack")
    elif s.organization is not None and (match["org"] == DIY_ORGANIZATION) != (
            s.organization == DIY_ORGANIZATION):
        backend = ("a self-managed backend, whose organization is always "
                   f"{DIY_ORGANIZATION!r}" if s.organization == DIY_ORGANIZATION
                   else f"Pulumi Cloud (organization {s.organization!r})")
        yield (key, f"{ref!r} does not name a stack on this stack's backend, {backend}: "
                    f"use {STACK_REF_FORMS}")
    if s.team == DEFAULT_TEAM or not LOGICAL_NAME_RE.match(s.team):
        yield (f"{NAMESPACE}:team", f"{s.team!r}: a team stack names its team, a key of the "
                                    f"platform stack's {TEAMS_KEY} ({LOGICAL_NAME_RULE})")
    for field in ("teams", "quota", "billing", "team_projects"):
        if getattr(s, field):
            yield (f"{NAMESPACE}:{to_camel(field)}", f"belongs to the platform stack ({ref}), "
                                           f"not to a team stack")
    if s.project.create:
        yield (f"{NAMESPACE}:project.create", f"the platform stack ({ref}) owns the project")
    if s.network != NetworkSettings():
        yield (f"{NAMESPACE}:network", f"the platform stack ({ref}) owns the network; its "
                                       f"subnets serve the team's nodes")
    if COST_CENTRE not in s.labels:
        yield (f"{NAMESPACE}:labels.{COST_CENTRE}", "is required in a team stack: every "
                                                    "billable resource carries a cost centre")


_ACCOUNT_EMAIL_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]"
                               r"\.iam\.gserviceaccount\.com$")
_RESERVATION_RE = re.compile(r"^projects/(?P<owner>[^/]+)/locations/(?P<zone>[^/]+)/"
                             r"reservations/(?P<name>[^/]+)$")


def _platform_deployer_problems(s: StackSettings) -> Problems:
    """The platform deployer creates the team nodes it declares running as their team's
    account: it needs actAs there, which the stack grants it by its email (issue 34)."""
    key = f"{TEAM_PROJECTS_KEY}.deployer"
    deployer = s.team_projects.deployer if s.team_projects else None
    if deployer is not None and not _ACCOUNT_EMAIL_RE.match(deployer):
        yield (key, f"{deployer!r} is not a service account email "
                    f"(<id>@<project>.iam.gserviceaccount.com)")
    with_nodes = sorted(name for name, team in s.teams.items() if team.nodes)
    if deployer is None and with_nodes:
        yield (key, f"is required when the platform declares team nodes ({', '.join(with_nodes)}):"
                    f" the email of the platform's deployer (the bootstrap's --deployer), which "
                    f"needs actAs on each team's runtime account its nodes run as")
    for name, team in s.teams.items():
        yield from _team_reservation_problems(s, f"{TEAMS_KEY}.{name}.nodes", team.nodes)


def _team_reservation_problems(s: StackSettings, key: str,
                               nodes: list[NodeSettings]) -> Problems:
    """A team's node lives in the team's project, where the TPU API finds none of the
    platform's reservations: it picks one by accelerator type, project and zone, and
    another project's only when a queued resource names it (`reservationName`,
    cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources)."""
    for index, node in enumerate(nodes):
        where = f"{key}[{index}]"
        example = f"projects/{s.gcp_project}/locations/{node.zone}/reservations/<NAME>"
        if node.provisioning == "reserved":
            yield (f"{where}.provisioning",
                   f"reserved capacity in a team's project finds no reservation: the TPU API "
                   f"looks in the node's own project; name the platform's: provisioning: "
                   f"queued with queue.reservationName: {example}")
        name = node.queue.reservation_name if node.queue else None
        match = _RESERVATION_RE.match(name) if name else None
        if name and (match is None or match["zone"] != node.zone):
            yield (f"{where}.queue.reservationName",
                   f"{name!r}: a team's node names its reservation in full, in its own zone: "
                   f"{example}")


def _team_subnet_problems(s: StackSettings) -> Problems:
    """Each team has its own subnet in every region of the network (its nodes' only
    addresses, the source of its firewall rule): a slot of its own, a base that holds
    every slot, outside the platform's own ranges (issue 34)."""
    key = f"{NAMESPACE}:network.teamSubnetCidr"
    cidr = s.network.team_subnet_cidr
    problem = _range_problem(cidr)
    if problem is None and subnets.team_slots(cidr) == 0:
        problem = f"{cidr} is narrower than one team's block (/{subnets.TEAM_BLOCK_PREFIX})"
    if problem is not None:
        yield (key, problem)
        return
    base = ipaddress.IPv4Network(cidr)
    grid = subnets.grid_ranges(s.network.subnet_cidr, s.network.subnets)
    shared = [f"{region} {taken}" for region, taken in grid.items()
              if base.overlaps(ipaddress.IPv4Network(taken))]
    if shared:
        yield (key, f"{cidr} overlaps the platform's own ranges ({', '.join(shared)}): teams' "
                    f"subnets must not share the platform's addresses")
    owners: dict[int, str] = {}
    for name, team in sorted(s.teams.items()):
        slot_key = f"{TEAMS_KEY}.{name}.subnetSlot"
        if team.subnet_slot is None:
            yield (slot_key, f"is required with {TEAMS_KEY}: a number of the team's own, "
                             f"never reused (its subnets in {cidr})")
        elif team.subnet_slot >= subnets.team_slots(cidr):
            yield (slot_key, f"{team.subnet_slot}: {cidr} holds slots 0 to "
                             f"{subnets.team_slots(cidr) - 1}")
        elif team.subnet_slot in owners:
            yield (slot_key, f"{team.subnet_slot} is team {owners[team.subnet_slot]}'s: each "
                             f"team has a slot of its own")
        else:
            owners[team.subnet_slot] = name
