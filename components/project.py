"""The GCP project (adopted or created) and the APIs every other resource needs."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from model.pulumi_types import COMPONENT_PROJECT
from model.settings.schema import ProjectSettings

TYPE = COMPONENT_PROJECT

# Every API a stack uses: TPUs, their VMs and network, buckets, service
# accounts and their tokens (iamcredentials backs impersonation and WIF),
# project IAM grants (Resource Manager's setIamPolicy), logs and metrics the
# job writes.
TPU_API = "tpu.googleapis.com"
APIS = (
    TPU_API,
    "compute.googleapis.com",
    "storage.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
)
# Team budgets (components/teams.py) go through the Billing Budgets API, which must
# be enabled in the project that the provider bills the calls to (pulumi-gcp
# `billing.Budget`: billing_project + user_project_override, or 403).
BUDGETS_API = "billingbudgets.googleapis.com"


@dataclass(frozen=True)
class ProjectArgs:
    project_id: str
    settings: ProjectSettings
    labels: dict[str, str]
    apis: tuple[str, ...] = APIS


class Project(pulumi.ComponentResource):
    """Adopts `gcp:project` as it is, or creates it; enables the stack's APIs.

    `services` is what every other resource depends on.
    """

    project_id: pulumi.Output[str]
    # The created project's number; None for an adopted one (look it up).
    number: pulumi.Output[str] | None
    services: list[gcp.projects.Service]
    by_api: dict[str, gcp.projects.Service]
    tpu_api: gcp.projects.Service  # what TPU nodes wait for

    def __init__(self, name: str, args: ProjectArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        project_id: pulumi.Input[str] = args.project_id
        self.number = None
        if args.settings.create:
            created = gcp.organizations.Project(
                "project",
                project_id=args.project_id,
                name=args.project_id,
                billing_account=args.settings.billing_account,
                folder_id=args.settings.folder_id,
                org_id=args.settings.org_id,
                # The stack declares its own VPC; the default network would only
                # add wide-open firewall rules.
                auto_create_network=False,
                labels=args.labels,
                deletion_policy="PREVENT",
                opts=child.merge(pulumi.ResourceOptions(protect=True)),
            )
            project_id = created.project_id
            # A lookup (get_project) would run against a project that does not
            # exist yet at the first preview; the resource knows its number.
            self.number = created.number
        self.project_id = pulumi.Output.from_input(project_id)
        self.services = [
            gcp.projects.Service(
                f"api-{api.split('.')[0]}",
                project=project_id,
                service=api,
                # docs/tpu-facts.md: the SDK defaults disable_on_destroy to true, which
                # switches APIs off in a shared project when a stack is destroyed.
                disable_on_destroy=False,
                disable_dependent_services=False,
                opts=child,
            )
            for api in args.apis
        ]
        self.by_api = dict(zip(args.apis, self.services, strict=True))
        self.tpu_api = self.by_api[TPU_API]
        self.register_outputs({"projectId": self.project_id})
