"""Teams of a platform, each fenced in by GCP's own boundaries (docs/teams.md).

`TeamProject`: what the platform stack declares for every team it serves, even
one that deploys from its own stack, in the team's own project (made in a folder
by the bootstrap step, scripts/bootstrap_team_projects.py): its attachment as a
Shared VPC service project of the platform's project, a firewall rule between the
team's nodes only, its TPU quota capped in that project (Cloud Quotas), the team's
runtime account and who may act as it, its members' and its keyless deployer's
rights (on that project, the platform's subnets and, on a shared gs:// backend,
its own stack's state only), and a budget on the project.

`TeamSpace`: the team's own buckets in its project and the runtime account's
and members' grants on exactly those. It reads the platform's shared buckets
(data, and the code archive unless the team ships its own) and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from components.ci import CI_APIS, CiArgs, CiIdentity
from components.identity import IdentityArgs, RuntimeIdentity
from components.network import peer_firewall
from components.project import APIS, TPU_API
from components.storage import BucketsArgs, TrainingBuckets
from model import team_state
from model.naming import Naming, fit
from model.pulumi_types import COMPONENT_TEAM_PROJECT, COMPONENT_TEAM_SPACE
from model.roles import (
    ACT_AS_ROLE,
    BUCKET_METADATA_ROLE,
    BUCKET_ROLES,
    MEMBER_PROJECT_ROLES,
    NETWORK_USER_ROLE,
    PROJECT_ROLES,
    TPU_AGENT_DOMAIN,
    TPU_XPN_AGENT_ROLE,
)
from model.settings.schema import CiSettings, StorageSettings, TeamQuota
from model.team_quota import SKIPPED_SAFETY_CHECK, quota_caps

SPACE_TYPE = COMPONENT_TEAM_SPACE
PROJECT_TYPE = COMPONENT_TEAM_PROJECT

# A team's own buckets in the platform stack; data and code stay the platform's.
OWN_PURPOSES = ("checkpoints", "logs")
# A team stack also ships its own training package, so it owns a code bucket.
TEAM_STACK_PURPOSES = ("artifacts", "checkpoints", "logs")
# On a shared gs:// backend (model/team_state.py): a team's deployer writes
# its own stack's objects and reads the platform's; legacyBucketReader lists.
STATE_WRITE_ROLE = "roles/storage.objectUser"
STATE_READ_ROLE = "roles/storage.objectViewer"
# A team's QuotaPreferences go through the Cloud Quotas API
# (cloud.google.com/docs/quotas/api-overview), enabled in the team's project.
QUOTAS_API = "cloudquotas.googleapis.com"
TEAM_APIS = (*APIS, QUOTAS_API)
# cloud.google.com/billing/docs/reference/budget/rest/v1/billingAccounts.budgets:
# displayName is at most 60 characters.
BUDGET_NAME_MAX = 60


@dataclass(frozen=True)
class TeamSpaceArgs:
    team: str
    project_id: pulumi.Input[str]
    naming: Naming
    storage: StorageSettings
    labels: dict[str, str]  # the team's resource labels (team, cost-centre, …)
    members: pulumi.Input[Sequence[str]]
    shared_buckets: dict[str, pulumi.Input[str]]  # purpose → bucket name, read-only
    account_email: pulumi.Input[str]  # the team's runtime account (TeamProject's)
    own_purposes: tuple[str, ...] = OWN_PURPOSES


class TeamSpace(pulumi.ComponentResource):
    """A team's runtime account, its own buckets and its members' grants."""

    buckets: TrainingBuckets
    identity: RuntimeIdentity

    def __init__(self, name: str, args: TeamSpaceArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(SPACE_TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.shared = dict(args.shared_buckets)
        self.buckets = TrainingBuckets(f"{args.team}-storage", BucketsArgs(
            project_id=args.project_id, naming=args.naming, settings=args.storage,
            labels=args.labels, team=args.team, purposes=args.own_purposes), opts=child)
        readable = {**self.shared, **{p: b.name for p, b in self.buckets.buckets.items()}}
        self.identity = RuntimeIdentity(f"{args.team}-identity", IdentityArgs(
            project_id=args.project_id, naming=args.naming, buckets=readable,
            team=args.team, members=args.members, email=args.account_email), opts=child)
        self.register_outputs({"buckets": self.bucket_uris(),
                               "serviceAccount": self.identity.email})

    def bucket_uris(self) -> dict[str, str]:
        return {p: self.buckets.uri(p) for p in self.buckets.names}


@dataclass(frozen=True)
class TeamBudget:
    """A monthly budget: `usd_per_month`, or last month's spend when None."""

    billing_account: str
    usd_per_month: float | None
    alert_thresholds: list[float]
    # projects/<p>/topics/<t>: every update of the budget goes there (the budget-stop
    # function's trigger, components/budget_stop.py); None: alerts only.
    pubsub_topic: pulumi.Input[str] | None = None


@dataclass(frozen=True)
class BudgetsAccess:
    """How budgets reach the Billing Budgets API: a provider that bills the calls
    to the stack's project, and that project's enabled API to wait for."""

    provider: pulumi.ProviderResource
    api: pulumi.Resource


def budgets_provider(project_id: pulumi.Input[str],
                     opts: pulumi.ResourceOptions | None = None) -> gcp.Provider:
    """pulumi-gcp's `billing.Budget` page: with user ADCs the provider needs
    `billing_project` and `user_project_override=true`, or the Billing Budgets API
    answers 403; the caller needs serviceusage.services.use on that project.
    With a service account (CI) the override is harmless: calls are billed to the
    same project the API is enabled in."""
    return gcp.Provider("budgets", project=project_id, billing_project=project_id,
                        user_project_override=True, opts=opts)


def budget_amount(usd_per_month: float | None) -> gcp.billing.BudgetAmountArgs:
    if usd_per_month is None:
        return gcp.billing.BudgetAmountArgs(last_period_amount=True)
    amount = gcp.billing.BudgetAmountSpecifiedAmountArgs(
        currency_code="USD", units=str(round(usd_per_month)))
    return gcp.billing.BudgetAmountArgs(specified_amount=amount)


@dataclass(frozen=True)
class HostNetwork:
    """The platform's project as Shared VPC host: its id, the host resource and
    its subnets by region."""

    project_id: pulumi.Input[str]
    host: gcp.compute.SharedVPCHostProject
    subnets: dict[str, gcp.compute.Subnetwork]
    network_id: pulumi.Input[str]


@dataclass(frozen=True)
class TeamProjectArgs:
    team: str
    stack: str
    naming: Naming
    members: list[str]
    quota: TeamQuota
    regions: dict[str, list[str]]  # family → regions of the platform's quota (granted)
    network: HostNetwork
    data_bucket: pulumi.Input[str]  # the platform's shared data, read-only
    subnet_ranges: dict[str, str]  # region → the team's own range (subnets.team_ranges)
    quota_contact: str | None = None  # Cloud Quotas' contact for increase requests
    state_bucket: str | None = None  # a shared gs:// backend's bucket (team_state.py)
    ci: CiSettings | None = None
    budget: TeamBudget | None = None
    budgets: BudgetsAccess | None = None  # required with a budget
    # The platform deployer, when the platform declares this team's nodes: it creates
    # them running as the team's account, so it gets actAs on that account alone.
    platform_deployer: str | None = None
    # The controller's account (model/function_accounts.py), when the platform runs one:
    # it creates the team's candidate requests in the team's subnets, as the deployer
    # does at `up` (the proof's USES_SUBNET), so it holds networkUser there too.
    controller: str | None = None


class TeamProject(pulumi.ComponentResource):
    """A team's own project, attached to the platform's Shared VPC, capped to the
    team's quota, with its runtime account, members, deployer and budget."""

    project_id: pulumi.Output[str]
    account: gcp.serviceaccount.Account
    tpu_api: gcp.projects.Service  # what the team's nodes wait for, with `grants`
    ci: CiIdentity | None
    grants: list[pulumi.Resource]  # what the team's nodes wait for

    def __init__(self, name: str, args: TeamProjectArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(PROJECT_TYPE, name, None, opts)
        self.args, t = args, f"{args.team}-"
        child = pulumi.ResourceOptions(parent=self)
        # The project itself is made by the bootstrap step, not by this stack
        # (scripts/bootstrap_team_projects.py, docs/teams.md "Who deploys what"):
        # Resource Manager makes a project's creator its owner, and a deployer
        # holding projectCreator and billing.user could make any number of
        # projects it owns, billed to the shared account, outside every cap and
        # budget. Here it is looked up; the platform deployer only holds the
        # folder roles of ci.PLATFORM_FOLDER_ROLES in it.
        project_id = args.naming.team_project(args.team)
        self.project_id = pulumi.Output.from_input(project_id)
        self.project_number = gcp.organizations.get_project_output(project_id=project_id).number
        apis = (*TEAM_APIS, *(CI_APIS if args.ci else ()))
        services = [gcp.projects.Service(
            f"{t}api-{api.split('.')[0]}", project=self.project_id, service=api,
            disable_on_destroy=False, disable_dependent_services=False, opts=child)
            for api in apis]
        self.tpu_api = services[apis.index(TPU_API)]
        self.services = services  # what the team's monitoring waits for (monitoring.py)
        after = child.merge(pulumi.ResourceOptions(depends_on=services))
        attached = gcp.compute.SharedVPCServiceProject(
            f"{t}shared-vpc", host_project=args.network.host.project,
            service_project=self.project_id, opts=after)
        self.account = gcp.serviceaccount.Account(
            f"{t}runtime", account_id=args.naming.account_id("runtime", args.team),
            display_name=f"tpu-stack runtime of team {args.team}"[:100],
            project=self.project_id, opts=after)
        self.member = self.account.email.apply(lambda email: f"serviceAccount:{email}")
        # The team's own subnets: its nodes' only addresses, which no other team may use.
        self.subnets = self._subnets(child)
        # The team's nodes reach each other and no other team's (network.py).
        self.firewall = peer_firewall(
            f"{t}peers", args.naming.network_resource(f"tpu-{args.team}-peers"),
            args.network.project_id, args.network.network_id,
            sorted(args.subnet_ranges.values()), child)
        self.grants = [attached, self.firewall, *self._runtime_grants(child),
                       *self._tpu_agent(after), *self._platform_act_as(child)]
        self._members(child)
        if args.controller:
            self._network_users("controller", f"serviceAccount:{args.controller}", child)
        self.ci = self._deployer(after)
        self._quota(after)
        if args.budget:
            if args.budgets is None:
                raise ValueError("TeamProjectArgs.budgets is required with a budget")
            self._budget(args.budget, child.merge(pulumi.ResourceOptions(
                provider=args.budgets.provider, depends_on=[args.budgets.api])))
        self.register_outputs({"projectId": self.project_id,
                               "serviceAccount": self.account.email})

    def _project_grant(self, logical: str, role: str, member: pulumi.Input[str],
                       opts: pulumi.ResourceOptions,
                       project: pulumi.Input[str] | None = None) -> gcp.projects.IAMMember:
        return gcp.projects.IAMMember(
            f"{self.args.team}-{logical}", project=project or self.project_id, role=role,
            member=member, opts=opts)

    def _platform_act_as(self, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """Creating a node that runs as an account needs iam.serviceAccounts.actAs on it
        (cloud.google.com/iam/docs/service-accounts-actas): the platform deployer gets it
        on this team's account only, never folder- or project-wide."""
        deployer = self.args.platform_deployer
        if deployer is None:
            return []
        return [gcp.serviceaccount.IAMMember(
            f"{self.args.team}-platform-deployer-act-as", service_account_id=self.account.name,
            role=ACT_AS_ROLE, member=f"serviceAccount:{deployer}", opts=child)]

    def _runtime_grants(self, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """Its project roles in the team's project, and reading the shared data."""
        grants: list[pulumi.Resource] = [
            self._project_grant(role.split("/", 1)[1].replace(".", "-"), role, self.member, child)
            for role in PROJECT_ROLES]
        for role in (BUCKET_ROLES["data"], BUCKET_METADATA_ROLE):
            grants.append(gcp.storage.BucketIAMMember(
                f"{self.args.team}-data-{role.rsplit('.', 1)[-1]}", bucket=self.args.data_bucket,
                role=role, member=self.member, opts=child))
        return grants

    def _tpu_agent(self, after: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The project's TPU service agent may place nodes in the host's subnets.
        gcp.projects.ServiceIdentity creates it before its first node (`gcloud compute
        tpus tpu-vm service-identity create` does the same); its email is derived from
        the project number (unconfirmed that serviceusage's generateServiceIdentity
        serves tpu.googleapis.com; the TPU API's own generateServiceIdentity does)."""
        t = self.args.team
        identity = gcp.projects.ServiceIdentity(
            f"{t}tpu-agent", project=self.project_id, service=TPU_API, opts=after)
        agent = pulumi.Output.concat("serviceAccount:service-", self.project_number, "@",
                                     TPU_AGENT_DOMAIN)
        after_agent = pulumi.ResourceOptions(parent=self, depends_on=[identity])
        grants: list[pulumi.Resource] = [self._project_grant(
            "tpu-agent-xpn", TPU_XPN_AGENT_ROLE, agent, after_agent,
            project=self.args.network.project_id)]
        grants += self._network_users("tpu-agent", agent, after_agent)
        return grants

    def _subnets(self, child: pulumi.ResourceOptions) -> dict[str, gcp.compute.Subnetwork]:
        """One subnet per region of the platform's network, in the host project, with
        Private Google Access like the platform's own (network.py)."""
        args = self.args
        return {region: gcp.compute.Subnetwork(
            f"{args.team}-subnet-{region}",
            name=args.naming.network_resource(f"tpu-{args.team}-{region}"),
            project=args.network.project_id, region=region, network=args.network.network_id,
            ip_cidr_range=cidr, private_ip_google_access=True, opts=child)
            for region, cidr in sorted(args.subnet_ranges.items())}

    def _network_users(self, logical: str, member: pulumi.Input[str],
                       opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """compute.networkUser on the team's own subnets only (never the platform's nor
        another team's): the team's nodes can take addresses there and nowhere else."""
        network = self.args.network
        return [gcp.compute.SubnetworkIAMMember(
            f"{self.args.team}-{logical}-network-user-{region}", project=network.project_id,
            region=region, subnetwork=subnet.name, role=NETWORK_USER_ROLE, member=member,
            opts=opts) for region, subnet in sorted(self.subnets.items())]

    def _members(self, child: pulumi.ResourceOptions) -> None:
        """Members see their project's TPU nodes and may act as the team's account.
        One IAMMember each, never an authoritative IAMBinding: the deployer's actAs
        is an IAMMember of the same role on the same account, and pulumi-gcp says
        IAMBinding "can be used in conjunction with IAMMember only if they do not
        grant privilege to the same role" (serviceaccount.IAMBinding docs): the
        binding would remove the member's grant at every `up` (policy pack rule
        `no-binding-beside-member`)."""
        for member in self.args.members:
            suffix = member.replace(":", "-")
            for role in MEMBER_PROJECT_ROLES:
                role_name = role.split("/", 1)[1].replace(".", "-")
                self._project_grant(f"{role_name}-{suffix}", role, member, child)
            gcp.serviceaccount.IAMMember(
                f"{self.args.team}-members-act-as-{suffix}", service_account_id=self.account.name,
                role=ACT_AS_ROLE, member=member, opts=child)

    def _deployer(self, after: pulumi.ResourceOptions) -> CiIdentity | None:
        """The team's keyless deployer, like the stack's own CI, in the team's project:
        TPU and bucket rights there (ci.TEAM_DEPLOYER_ROLES), acting as the team's
        account and using the host's subnets, nothing more."""
        args = self.args
        if args.ci is None:
            return None
        ci = CiIdentity(f"ci-{args.team}", CiArgs(args.ci, self.project_id, args.naming,
                                                   team=args.team), opts=after)
        member = ci.deployer_email.apply(lambda email: f"serviceAccount:{email}")
        child = pulumi.ResourceOptions(parent=self)
        gcp.serviceaccount.IAMMember(
            f"{args.team}-deployer-act-as", service_account_id=self.account.name,
            role=ACT_AS_ROLE, member=member, opts=child)
        self._network_users("deployer", member, child)
        if args.state_bucket:
            self._state(args.state_bucket, ci, child)
        return ci

    def _state(self, bucket: str, ci: CiIdentity, child: pulumi.ResourceOptions) -> None:
        """On a shared gs:// backend: the deployer writes its team stack's state only,
        the preview account reads it; both read the team's outputs object the platform
        writes (never the platform's stack file, which holds every team's) and list the
        bucket (team_state.py)."""
        t, own = self.args.team, team_state.team_stack(self.args.team)
        outputs = (team_state.outputs_object(self.args.stack, t),)
        grants = [
            ("deployer", ci.deployer_email, STATE_WRITE_ROLE,
             team_state.write_condition(bucket, own)),
            ("deployer", ci.deployer_email, STATE_READ_ROLE,
             team_state.read_condition(bucket, [], outputs)),
            ("preview", ci.preview_email, STATE_READ_ROLE,
             team_state.read_condition(bucket, [own], outputs)),
        ]
        for who, email, role, expression in grants:
            name = role.rsplit(".", 1)[-1]
            gcp.storage.BucketIAMMember(
                f"{t}-{who}-state-{name}", bucket=bucket, role=role,
                member=email.apply(lambda e: f"serviceAccount:{e}"),
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title=f"tpu-stack state of team {t}"[:100], expression=expression),
                opts=child)
        for who, email in (("deployer", ci.deployer_email), ("preview", ci.preview_email)):
            gcp.storage.BucketIAMMember(
                f"{t}-{who}-state-list", bucket=bucket, role=BUCKET_METADATA_ROLE,
                member=email.apply(lambda e: f"serviceAccount:{e}"), opts=child)

    def _quota(self, after: pulumi.ResourceOptions) -> None:
        """The team's chips as its project's TPU quota (Cloud Quotas QuotaPreference,
        pulumi-gcp `cloudquota.SQuotaPreference`): GCP refuses a node beyond it,
        whoever creates it. A preference above what Google granted is a request that
        Google approves or not; below, it applies at once (SKIPPED_SAFETY_CHECK)."""
        args = self.args
        self.quota_caps = quota_caps(args.quota, args.regions, sorted(args.subnet_ranges))
        # The unconfirmed ids: one warning for every team, by the platform (platform.py).
        for cap in self.quota_caps:
            if cap.quota_id is None:
                pulumi.log.warn(f"team {args.team}: no Cloud Quotas id is known for {cap.family} "
                                f"{cap.quota_type} chips (model/catalog.py); its quota in "
                                f"{cap.region} is checked at preview only", resource=self)
                continue
            gcp.cloudquota.SQuotaPreference(
                f"{args.team}-quota-{cap.family}-{cap.quota_type}-{cap.region}",
                parent=pulumi.Output.concat("projects/", self.project_id),
                name=f"tpu-{cap.family}-{cap.quota_type.lower()}-{cap.region}",
                service=TPU_API, quota_id=cap.quota_id, dimensions={"region": cap.region},
                quota_config=gcp.cloudquota.SQuotaPreferenceQuotaConfigArgs(
                    preferred_value=str(cap.chips)),
                ignore_safety_checks=SKIPPED_SAFETY_CHECK,
                justification=f"tpu-stack {args.stack}: team {args.team}'s TPU quota",
                contact_email=args.quota_contact,
                opts=after)

    def _budget(self, budget: TeamBudget, child: pulumi.ResourceOptions) -> None:
        args = self.args
        gcp.billing.Budget(
            f"{args.team}-budget",
            billing_account=budget.billing_account,
            display_name=fit(f"tpu-stack {args.stack} {args.team}", BUDGET_NAME_MAX),
            amount=budget_amount(budget.usd_per_month),
            # The team's spend: everything billed to its own project. No label
            # filter: each filter admits "usage from only this set of labeled
            # resources" / "of projects" (pulumi-gcp billing BudgetBudgetFilterArgs),
            # so a label filter beside the project would drop what carries no
            # `team` label (a node made with plain gcloud, egress, logging).
            # Labels stay on resources for reporting (naming.labels).
            budget_filter=gcp.billing.BudgetBudgetFilterArgs(
                projects=[pulumi.Output.concat("projects/", self.project_number)],
                calendar_period="MONTH",
            ),
            threshold_rules=[gcp.billing.BudgetThresholdRuleArgs(threshold_percent=t)
                             for t in budget.alert_thresholds],
            # Notifications to the topic come with every update, several times a day
            # (cloud.google.com/billing/docs/how-to/budgets-programmatic-notifications);
            # the default email recipients keep their alerts.
            all_updates_rule=None if budget.pubsub_topic is None else
            gcp.billing.BudgetAllUpdatesRuleArgs(pubsub_topic=budget.pubsub_topic,
                                                 schema_version="1.0"),
            opts=child,
        )
