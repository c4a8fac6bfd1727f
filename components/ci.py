"""Keyless CI: GitHub Actions of one repository deploy this stack through
Workload Identity Federation, never through a service-account key.

A workload identity pool with a GitHub OIDC provider that accepts only the
configured repository's tokens, a deployer service account with the roles a
`pulumi up` of this stack needs, and the one binding that lets that
repository impersonate it. None of these resources take labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from components.naming import Naming
from components.settings import CiSettings

TYPE = "tpu-stack:index:CiIdentity"

# GitHub's OIDC issuer for Actions (docs.github.com, "About security hardening
# with OpenID Connect"; google-github-actions/auth README).
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
# Claims of GitHub's token mapped to pool attributes; `attribute.repository`
# is what the impersonation binding and the condition below match on.
ATTRIBUTE_MAPPING = {
    "google.subject": "assertion.sub",
    "attribute.actor": "assertion.actor",
    "attribute.repository": "assertion.repository",
    "attribute.repository_owner": "assertion.repository_owner",
    "attribute.ref": "assertion.ref",
}

# Project roles of the deployer: exactly what `pulumi up` of this stack
# creates, reads and deletes (components/*.py), each with its reason.
# Workload Identity Federation exchanges the GitHub token at the Security Token
# Service (cloud.google.com/iam/docs/workload-identity-federation-with-deployment-
# pipelines: enable the IAM, Resource Manager, Service Account Credentials and
# Security Token Service APIs; the other three every stack enables already).
CI_APIS = ("sts.googleapis.com",)

DEPLOYER_ROLES = {
    "roles/serviceusage.serviceUsageAdmin": "project.py turns the stack's APIs on",
    "roles/compute.networkAdmin": "network.py creates the network and subnetwork",
    "roles/compute.securityAdmin": "network.py creates the firewall rules",
    "roles/tpu.admin": "tpu_node.py / queued_tpu.py create, update, delete TPU nodes",
    "roles/iam.serviceAccountAdmin": "identity.py and ci.py manage accounts and their IAM",
    "roles/iam.serviceAccountUser": "a TPU node runs as the runtime account (actAs)",
    "roles/resourcemanager.projectIamAdmin": "identity.py grants the runtime account project roles",
    "roles/iam.workloadIdentityPoolAdmin": "ci.py manages this pool and provider",
    "roles/iam.roleAdmin": "ci.py manages the storage deployer custom role",
}

# storage.py and package.py need bucket creation; the only predefined role
# with storage.buckets.create is roles/storage.admin, which the policy pack
# forbids at project level. A custom role carries just these permissions
# (cloud.google.com/storage/docs/access-control/iam-permissions).
STORAGE_PERMISSIONS = (
    "storage.buckets.create",
    "storage.buckets.delete",
    "storage.buckets.get",
    "storage.buckets.list",
    "storage.buckets.update",
    "storage.buckets.getIamPolicy",
    "storage.buckets.setIamPolicy",
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)
STORAGE_ROLE_ID = "tpuStackStorageDeployer"


@dataclass(frozen=True)
class CiArgs:
    settings: CiSettings
    project_id: pulumi.Input[str]
    naming: Naming


def repository_principal(pool_name: str, repository: str) -> str:
    """Every token of `repository` from the pool (`projects/N/locations/global/…/ID`)."""
    return f"principalSet://iam.googleapis.com/{pool_name}/attribute.repository/{repository}"


class CiIdentity(pulumi.ComponentResource):
    """The pool, the GitHub provider and the deployer a repository's workflows use.

    Outputs for the repository's variables: `provider_name`
    (GCP_WORKLOAD_IDENTITY_PROVIDER) and `deployer_email` (GCP_SERVICE_ACCOUNT).
    """

    pool: gcp.iam.WorkloadIdentityPool
    provider: gcp.iam.WorkloadIdentityPoolProvider
    deployer: gcp.serviceaccount.Account
    provider_name: pulumi.Output[str]
    deployer_email: pulumi.Output[str]

    def __init__(self, name: str, args: CiArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        ci = args.settings
        # Pools and providers are soft-deleted: recreating the same id after a
        # destroy fails with 409 for 30 days (pulumi-gcp issue 1149, docs/tpu-facts.md),
        # and so are custom roles (7 days). No command deletes them.
        kept = pulumi.ResourceOptions(parent=self, protect=True)
        self.pool = gcp.iam.WorkloadIdentityPool(
            "pool",
            workload_identity_pool_id=args.naming.pool_id(ci.pool_id),
            display_name=f"tpu-stack CI {args.naming.stack}"[:32],
            description=f"GitHub Actions of {ci.github_repository}",
            project=args.project_id,
            opts=kept,
        )
        self.provider = gcp.iam.WorkloadIdentityPoolProvider(
            "github",
            workload_identity_pool_id=self.pool.workload_identity_pool_id,
            workload_identity_pool_provider_id=ci.provider_id,
            display_name="GitHub Actions",
            attribute_mapping=ATTRIBUTE_MAPPING,
            # GitHub uses one issuer for every repository: without a condition
            # any repository's token would be accepted by the pool.
            attribute_condition=f'assertion.repository == "{ci.github_repository}"',
            oidc=gcp.iam.WorkloadIdentityPoolProviderOidcArgs(issuer_uri=GITHUB_ISSUER),
            project=args.project_id,
            opts=kept,
        )
        self.deployer = self._deployer(args)
        self._grant_roles(args, kept)
        gcp.serviceaccount.IAMMember(
            "github-impersonates-deployer",
            service_account_id=self.deployer.name,
            role="roles/iam.workloadIdentityUser",
            member=self.pool.name.apply(
                lambda pool: repository_principal(pool, ci.github_repository)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.provider_name = self.provider.name
        self.deployer_email = self.deployer.email
        self.register_outputs({"providerName": self.provider_name,
                               "deployerEmail": self.deployer_email})

    def _deployer(self, args: CiArgs) -> gcp.serviceaccount.Account:
        account_id = args.naming.account_id("deployer")
        return gcp.serviceaccount.Account(
            "deployer",
            account_id=account_id,
            display_name=f"tpu-stack deployer ({account_id})",
            description=f"pulumi up from GitHub Actions of {args.settings.github_repository}",
            project=args.project_id,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _grant_roles(self, args: CiArgs, kept: pulumi.ResourceOptions) -> None:
        member = self.deployer.email.apply(lambda email: f"serviceAccount:{email}")
        child = pulumi.ResourceOptions(parent=self)
        storage_role = gcp.projects.IAMCustomRole(
            "storage-deployer",
            role_id=STORAGE_ROLE_ID,
            title="tpu-stack storage deployer",
            description="Create and manage tpu-stack buckets and their objects",
            permissions=list(STORAGE_PERMISSIONS),
            project=args.project_id,
            opts=kept,
        )
        roles: list[tuple[str, pulumi.Input[str]]] = [
            (role.split("/", 1)[1].replace(".", "-"), role) for role in DEPLOYER_ROLES]
        roles.append(("storage-deployer", storage_role.name))
        for logical, role in roles:
            gcp.projects.IAMMember(
                f"deployer-{logical}", project=args.project_id, role=role, member=member,
                opts=child)
