"""Rules on shared capacity (docs/teams.md): teams, quota, budgets, team projects and
team stacks."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from pydantic.alias_generators import to_camel

from model import budget_hold, catalog, subnets
from model.naming import (
    LOGICAL_NAME_RE,
    LOGICAL_NAME_RULE,
)
from model.settings.rules.ci import ci_problems
from model.settings.rules.nodes import node_list_problems
from model.settings.rules.stack import jobs_problems, labels_problems, range_problem
from model.settings.rules.team_regions import team_region_problems
from model.settings.schema import (
    BILLING_RE,
    NAMESPACE,
    BillingSettings,
    Capacity,
    NetworkSettings,
    NodeSettings,
    ProjectChips,
    QuotaType,
    StackSettings,
    TeamProjectsSettings,
    TeamQuotaBase,
    TeamSettings,
)
from model.settings.suggest import Problems, did_you_mean

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
    yield from labels_problems(f"{key}.labels", team.labels)
    if team.ci:
        yield from ci_problems(team.ci, f"{key}.ci")
    yield from jobs_problems(f"{key}.jobs", team.jobs)
    yield from node_list_problems(f"{key}.nodes", team.nodes, team.jobs, f"{key}.jobs")
    yield from team_quota_problems(f"{key}.quota", name, team.nodes, team.quota)
    yield from team_region_problems(name, team)


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
                        quota: TeamQuotaBase) -> Problems:
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


def family_hint(name: str) -> str:
    """`; did you mean v5e?` for a family written as its accelerator-type prefix
    (v5litepod) or misspelt, else ""."""
    by_prefix = next((g.name for g in catalog.GENERATIONS.values()
                      if name.lower() == g.type_prefix.lower()), None)
    if by_prefix:
        return f"; did you mean {by_prefix}? ({name} is its accelerator-type prefix)"
    return did_you_mean(name, sorted(catalog.GENERATIONS), set())


def _quota_declaration_problems(quota: Mapping[str, Mapping[str, ProjectChips]]) -> Problems:
    for family, by_region in quota.items():
        try:
            gen = catalog.generation(family)
        except catalog.CatalogError as error:
            yield (f"{QUOTA_KEY}.{family}", f"{error}{family_hint(family)}")
            continue
        offered = sorted({catalog.region_of(zone) for zone in gen.zones})
        for region in by_region:
            if region not in offered:
                known = {catalog.region_of(zone) for zone in catalog.all_zones()}
                yield (f"{QUOTA_KEY}.{family}.{region}",
                       f"{family} is not offered in {region}"
                       f"{did_you_mean(region, offered, known)} (regions: {', '.join(offered)})")


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
    elif not BILLING_RE.match(account):
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
    if not s.team_billing_account:  # the budget lives where the team's project bills
        yield (f"{key}.budgetAction", f"stop needs a budget: set {NAMESPACE}:billing.account")


def _budget_hold_problems(name: str, team: TeamSettings) -> Problems:
    """liftBudgetHold names a budget interval by its month."""
    lift = team.lift_budget_hold
    if lift is not None and not budget_hold.INTERVAL_RE.match(lift):
        yield (f"{TEAMS_KEY}.{name}.liftBudgetHold", f"{lift!r} is not a budget interval: "
                                                     f"YYYY-MM, e.g. '2026-12'")


def _billing_problems(billing: BillingSettings) -> Problems:
    key = f"{NAMESPACE}:billing"
    if not BILLING_RE.match(billing.account):
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
        if node.provisioning == "reserved" and not node.fallback:  # else the node rule's
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
    problem = range_problem(cidr)
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
            taken = {spec.subnet_slot for spec in s.teams.values()}
            free = next(slot for slot in range(subnets.team_slots(cidr) + 1)
                        if slot not in taken)
            yield (slot_key, f"{team.subnet_slot} is team {owners[team.subnet_slot]}'s: each "
                             f"team has a slot of its own; slot {free} is free "
                             f"(subnetSlot: {free})")
        else:
            owners[team.subnet_slot] = name
