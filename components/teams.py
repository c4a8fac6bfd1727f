"""Teams in a shared TPU project (docs/teams.md).

`TeamSpace`: what fences one team in: its runtime service account, its own
buckets, and its members' grants on exactly those. It reads the platform's
shared buckets (data, and the code archive unless the team ships its own)
and nothing else.

`TeamAccess`: what the platform stack declares for every team it serves, even
one that deploys from its own stack: its members' project roles and a budget
filtered by the team's label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from components.identity import IdentityArgs, RuntimeIdentity
from components.naming import Naming, fit, label_value
from components.settings import StorageSettings
from components.storage import BucketsArgs, TrainingBuckets

SPACE_TYPE = "tpu-stack:index:TeamSpace"
ACCESS_TYPE = "tpu-stack:index:TeamAccess"

# A team's own buckets in the platform stack; data and code stay the platform's.
OWN_PURPOSES = ("checkpoints", "logs")
# A team stack also ships its own training package, so it owns a code bucket.
TEAM_STACK_PURPOSES = ("artifacts", "checkpoints", "logs")
# Project roles of a team's members: see the project's TPU nodes (node names,
# state, health). Logs are the team's logs bucket (RuntimeIdentity grants it):
# roles/logging.viewer would show every team's logs.
MEMBER_PROJECT_ROLES = ("roles/tpu.viewer",)
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
            team=args.team, members=args.members), opts=child)
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


@dataclass(frozen=True)
class TeamAccessArgs:
    team: str
    stack: str
    project_id: pulumi.Input[str]
    project_number: pulumi.Input[str]
    members: list[str]
    budget: TeamBudget | None
    budgets: BudgetsAccess | None = None  # required with a budget


def budget_amount(usd_per_month: float | None) -> gcp.billing.BudgetAmountArgs:
    if usd_per_month is None:
        return gcp.billing.BudgetAmountArgs(last_period_amount=True)
    amount = gcp.billing.BudgetAmountSpecifiedAmountArgs(
        currency_code="USD", units=str(round(usd_per_month)))
    return gcp.billing.BudgetAmountArgs(specified_amount=amount)


class TeamAccess(pulumi.ComponentResource):
    """A team's members' project roles, and its budget when billing is configured."""

    def __init__(self, name: str, args: TeamAccessArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(ACCESS_TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        for role in MEMBER_PROJECT_ROLES:
            role_name = role.split("/", 1)[1].replace(".", "-")
            for member in args.members:
                gcp.projects.IAMMember(
                    f"{args.team}-{role_name}-{member.replace(':', '-')}",
                    project=args.project_id, role=role, member=member, opts=child)
        if args.budget:
            if args.budgets is None:
                raise ValueError("TeamAccessArgs.budgets is required with a budget")
            self._budget(args, args.budget, child.merge(pulumi.ResourceOptions(
                provider=args.budgets.provider, depends_on=[args.budgets.api])))
        self.register_outputs({})

    def _budget(self, args: TeamAccessArgs, budget: TeamBudget,
                child: pulumi.ResourceOptions) -> None:
        gcp.billing.Budget(
            f"{args.team}-budget",
            billing_account=budget.billing_account,
            display_name=fit(f"tpu-stack {args.stack} {args.team}", BUDGET_NAME_MAX),
            amount=budget_amount(budget.usd_per_month),
            # The team's spend: resources of this project carrying its label
            # (every billable resource does, naming.labels).
            budget_filter=gcp.billing.BudgetBudgetFilterArgs(
                projects=[pulumi.Output.concat("projects/", args.project_number)],
                labels={"team": label_value(args.team)},
                calendar_period="MONTH",
            ),
            threshold_rules=[gcp.billing.BudgetThresholdRuleArgs(threshold_percent=t)
                             for t in budget.alert_thresholds],
            opts=child,
        )
