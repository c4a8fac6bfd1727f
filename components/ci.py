"""Keyless CI: GitHub Actions of one repository preview and deploy this stack
through Workload Identity Federation, never through a service-account key.

A workload identity pool with a GitHub OIDC provider that accepts only the
configured repository's tokens (by its immutable numeric ids), and two service
accounts: a read-only preview account any workflow of the repository may use
(pull requests), and a deployer with the roles a `pulumi up` of this stack
needs, which only a job of the deploy branch running in the stack's protected
GitHub environment can impersonate. None of these resources take labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from model.naming import Naming
from model.pulumi_types import COMPONENT_CI_IDENTITY
from model.roles import (
    DEPLOYER_ACCOUNT_ROLE,
    DEPLOYER_ACCOUNT_ROLES,
    DEPLOYER_ROLES,
    IMPERSONATION_ROLE,
    PREVIEW_ROLES,
    STORAGE_PERMISSIONS,
    STORAGE_ROLE,
    TEAM_DEPLOYER_ROLES,
    grants_only,
)
from model.settings.schema import CiSettings

TYPE = COMPONENT_CI_IDENTITY

# GitHub's OIDC issuer for Actions (docs.github.com, "OpenID Connect reference";
# google-github-actions/auth README).
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"

# The attribute the deployer's binding matches: the job's GitHub environment, but
# only in a token of the deploy branch; every other token maps to NOT_DEPLOYABLE.
# GitHub puts `environment` in the token only when the job references one, and
# `ref` is refs/pull/<n>/merge for a pull request (docs.github.com, "OpenID Connect
# reference", OIDC token claims). A job of another branch cannot name the
# environment and pass: `ref` is part of the same expression. The mapping is
# CEL, a conditional included: the IAM API's own default AWS mapping is one
# (cloud.google.com/iam/docs/reference/rest/v1/projects.locations.
# workloadIdentityPools.providers, attributeMapping). `has()` tests the claim's
# presence (a CEL macro; Google's Confidential Space conditions use
# `!has(assertion.…)`); its use in a WIF mapping is unconfirmed by Google's docs:
# if STS refused it, creating the provider would fail, never trust more.
DEPLOY_ATTRIBUTE = "deploys_to"
NOT_DEPLOYABLE = "none"


def attribute_mapping(deploy_branch: str) -> dict[str, str]:
    """Claims of GitHub's token as pool attributes; names only for the logs."""
    deploy = (f"has(assertion.environment) && assertion.ref == 'refs/heads/{deploy_branch}'"
              f" ? assertion.environment : '{NOT_DEPLOYABLE}'")
    return {
        "google.subject": "assertion.sub",
        "attribute.repository_id": "assertion.repository_id",
        "attribute.repository_owner_id": "assertion.repository_owner_id",
        "attribute.repository": "assertion.repository",
        "attribute.ref": "assertion.ref",
        "attribute.event_name": "assertion.event_name",
        f"attribute.{DEPLOY_ATTRIBUTE}": deploy,
    }


def attribute_condition(ci: CiSettings) -> str:
    """Only this repository's tokens enter the pool: GitHub uses one issuer for every
    repository, and names can be renamed and re-registered, ids cannot
    (google-github-actions/auth docs/SECURITY_CONSIDERATIONS.md)."""
    return (f"assertion.repository_id == '{ci.github_repository_id}' && "
            f"assertion.repository_owner_id == '{ci.github_repository_owner_id}'")


# Workload Identity Federation exchanges the GitHub token at the Security Token
# Service (cloud.google.com/iam/docs/workload-identity-federation-with-deployment-
# pipelines: enable the IAM, Resource Manager, Service Account Credentials and
# Security Token Service APIs; the other three every stack enables already).
CI_APIS = ("sts.googleapis.com",)


@dataclass(frozen=True)
class DeployerScope:
    """What the deployer's conditions allow: the project roles the stack grants
    (never the deployer's own) and the runtime accounts it runs nodes as."""

    granted_roles: list[str]
    accounts: list[pulumi.Input[str]]  # emails


@dataclass(frozen=True)
class CiArgs:
    settings: CiSettings
    project_id: pulumi.Input[str]
    naming: Naming
    scope: DeployerScope | None = None  # None: a team's deployer (TEAM_DEPLOYER_ROLES)
    team: str | None = None

    @property
    def deploy_environment(self) -> str:
        default = f"team-{self.team}" if self.team else self.naming.stack
        return self.settings.deploy_environment or default


# Principal identifiers of a pool (cloud.google.com/iam/docs/reference/rest/v1/
# projects.locations.workloadIdentityPools.providers, attributeMapping:
# principalSet://iam.googleapis.com/<pool>/attribute.<name>/<value>).
def attribute_principal(pool_name: str, attribute: str, value: str) -> str:
    """Every identity of the pool (`projects/N/locations/global/…/ID`) with that value."""
    return f"principalSet://iam.googleapis.com/{pool_name}/attribute.{attribute}/{value}"


class CiIdentity(pulumi.ComponentResource):
    """The pool, the GitHub provider, the preview account and the deployer.

    Outputs for the repository's variables (docs/pr-previews.md): `provider_name`
    (<STACK>_GCP_WORKLOAD_IDENTITY_PROVIDER), `preview_email`
    (<STACK>_GCP_PREVIEW_SERVICE_ACCOUNT) and `deployer_email`
    (<STACK>_GCP_DEPLOYER_SERVICE_ACCOUNT).
    """

    pool: gcp.iam.WorkloadIdentityPool
    provider: gcp.iam.WorkloadIdentityPoolProvider
    deployer: gcp.serviceaccount.Account
    preview: gcp.serviceaccount.Account
    provider_name: pulumi.Output[str]
    deployer_email: pulumi.Output[str]
    preview_email: pulumi.Output[str]

    def __init__(self, name: str, args: CiArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        ci = args.settings
        # Pulumi URNs leave out the parent's name: a team's children carry the team.
        self.prefix = p = f"{args.team}-" if args.team else ""
        # Pools and providers are soft-deleted: recreating the same id after a
        # destroy fails with 409 for 30 days (pulumi-gcp issue 1149, docs/tpu-facts.md),
        # and so are custom roles (7 days). No command deletes them.
        kept = pulumi.ResourceOptions(parent=self, protect=True)
        self.pool = gcp.iam.WorkloadIdentityPool(
            f"{p}pool",
            workload_identity_pool_id=args.naming.pool_id(ci.pool_id),
            display_name=f"tpu-stack CI {args.naming.stack}"[:32],
            description=f"GitHub Actions of {ci.github_repository}",
            project=args.project_id,
            opts=kept,
        )
        self.provider = gcp.iam.WorkloadIdentityPoolProvider(
            f"{p}github",
            workload_identity_pool_id=self.pool.workload_identity_pool_id,
            workload_identity_pool_provider_id=ci.provider_id,
            display_name="GitHub Actions",
            attribute_mapping=attribute_mapping(ci.deploy_branch),
            attribute_condition=attribute_condition(ci),
            oidc=gcp.iam.WorkloadIdentityPoolProviderOidcArgs(issuer_uri=GITHUB_ISSUER),
            project=args.project_id,
            opts=kept,
        )
        self.deployer = self._account(args, "deployer", "pulumi up")
        self.preview = self._account(args, "preview", "pulumi preview (read-only)")
        self._grant_deployer_roles(args, kept)
        self._grant(self.preview, "preview", _logical_roles(PREVIEW_ROLES), args)
        # Any workflow of the repository may preview; only the deploy branch's jobs
        # in the stack's environment deploy (attribute_mapping).
        self._impersonation("preview", self.preview, "repository_id", ci.github_repository_id)
        self._impersonation("deployer", self.deployer, DEPLOY_ATTRIBUTE, args.deploy_environment)
        self.provider_name = self.provider.name
        self.deployer_email = self.deployer.email
        self.preview_email = self.preview.email
        self.register_outputs({"providerName": self.provider_name,
                               "deployerEmail": self.deployer_email,
                               "previewEmail": self.preview_email})

    def _account(self, args: CiArgs, logical: str, purpose: str) -> gcp.serviceaccount.Account:
        account_id = args.naming.account_id(logical, args.team)
        return gcp.serviceaccount.Account(
            f"{self.prefix}{logical}",
            account_id=account_id,
            display_name=f"tpu-stack {logical} ({account_id})",
            description=f"{purpose} from GitHub Actions of {args.settings.github_repository}",
            project=args.project_id,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _impersonation(self, logical: str, account: gcp.serviceaccount.Account,
                       attribute: str, value: str) -> None:
        gcp.serviceaccount.IAMMember(
            f"{self.prefix}github-impersonates-{logical}",
            service_account_id=account.name,
            role=IMPERSONATION_ROLE,
            member=self.pool.name.apply(lambda pool: attribute_principal(pool, attribute, value)),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _grant(self, account: gcp.serviceaccount.Account, logical: str,
               roles: list[tuple[str, pulumi.Input[str]]], args: CiArgs,
               conditions: dict[str, pulumi.Output[str]] | None = None) -> None:
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        for name, role in roles:
            expression = (conditions or {}).get(role) if isinstance(role, str) else None
            condition = None if expression is None else gcp.projects.IAMMemberConditionArgs(
                title=f"tpu-stack {name}"[:100], expression=expression,
                description="limits the deployer to what this stack manages (components/ci.py)")
            gcp.projects.IAMMember(
                f"{self.prefix}{logical}-{name}", project=args.project_id, role=role, member=member,
                condition=condition, opts=pulumi.ResourceOptions(parent=self))

    def _grant_deployer_roles(self, args: CiArgs, kept: pulumi.ResourceOptions) -> None:
        role_name = self._storage_role(args, kept)
        profile = DEPLOYER_ROLES if args.scope else TEAM_DEPLOYER_ROLES
        roles = [*_logical_roles(profile), ("storage-deployer", role_name)]
        self._grant(self.deployer, "deployer", roles, args, self._conditions(args))
        for index, email in enumerate(args.scope.accounts if args.scope else []):
            account = pulumi.Output.all(args.project_id, email).apply(
                lambda parts: f"projects/{parts[0]}/serviceAccounts/{parts[1]}")
            for role in DEPLOYER_ACCOUNT_ROLES:
                logical = "acts-as" if role == DEPLOYER_ACCOUNT_ROLE else "administers"
                gcp.serviceaccount.IAMMember(
                    f"{self.prefix}deployer-{logical}-{index}", service_account_id=account,
                    role=role, member=self.deployer.email.apply(lambda e: f"serviceAccount:{e}"),
                    opts=pulumi.ResourceOptions(parent=self))

    def _storage_role(self, args: CiArgs, kept: pulumi.ResourceOptions) -> pulumi.Output[str]:
        """The storage custom role's name (projects/<p>/roles/<id>). A team's deployer's
        (no scope) is the bootstrap's, made with a fixed permission list (model/bootstrap.py
        custom_roles): the platform deployer holds no iam.roleAdmin where it grants it
        (issue 44). A single stack's is made here, by the admin's first `up`."""
        role_id = args.naming.custom_role_id(STORAGE_ROLE)
        if args.scope is None:
            return pulumi.Output.concat("projects/", args.project_id, "/roles/", role_id)
        storage_role = gcp.projects.IAMCustomRole(
            f"{self.prefix}storage-deployer", role_id=role_id,
            title="tpu-stack storage deployer",
            description="Create and manage tpu-stack buckets and their objects",
            permissions=list(STORAGE_PERMISSIONS), project=args.project_id, opts=kept)
        return pulumi.Output.all(storage_role.project, storage_role.role_id).apply(
            lambda parts: f"projects/{parts[0]}/roles/{parts[1]}")

    @staticmethod
    def _conditions(args: CiArgs) -> dict[str, pulumi.Output[str]]:
        scope = args.scope
        if scope is None:
            return {}
        return {"roles/resourcemanager.projectIamAdmin": pulumi.Output.from_input(
            grants_only(scope.granted_roles))}


def _logical_roles(roles: dict[str, str]) -> list[tuple[str, pulumi.Input[str]]]:
    """`roles/tpu.admin` -> ("tpu-admin", "roles/tpu.admin"): the grant's logical name."""
    return [(role.split("/", 1)[1].replace(".", "-"), role) for role in roles]
