"""The permission proof of a plan: for every resource, may the identity that applies it
create, update and delete it, as GCP decides (issue 34, docs/teams.md "The permission
proof")?

Pure: it reads plan resources (type, inputs, outputs, as ops/plan records them) and an
`IamModel` (policy/iam.py) of every allow binding the deployer holds: the plan's own
grants and the ones made outside it (the bootstrap's, model/bootstrap.py). For each
resource type the plan uses, `TABLE` names the permissions each operation needs and
where IAM checks them, each row citing its API method's reference. Beside the table:
- a resource that runs as an account needs `iam.serviceAccounts.actAs` on it
  (cloud.google.com/iam/docs/service-accounts-actas);
- a grant changes one role: on a project, folder or organization its setIamPolicy is
  checked with that role as `modifiedGrantsByRole`, so a `hasOnly` condition that
  leaves the role out refuses it (cloud.google.com/iam/docs/setting-limits-on-granting-
  roles: the condition applies to every role the request changes);
- a quota preference's contact must hold quota update permission where it applies;
- a node that uses reserved capacity must find a reservation (a fallback node: each
  candidate that names one): a reserved node uses one
  of its own project, picked by accelerator type, project and zone; another project's
  only when a queued resource names it (`reservationName`,
  `projects/OWNER/locations/ZONE/reservations/NAME`, cloud.google.com/tpu/docs/
  reference/rest/v2/projects.locations.queuedResources).
A missing permission is a `Finding` naming the resource, the identity, the permission,
where, and the grant that would fix it. What IAM itself refuses and the other identities
that act (custom roles' permissions, service agents, build and trigger accounts, a
budget's topic, shared reservations, role-content escapes) are policy/acting.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from model.pulumi_types import (
    BILLING_BUDGET,
    CLOUDFUNCTIONSV2_FUNCTION,
    CLOUDQUOTA_S_QUOTA_PREFERENCE,
    CLOUDRUNV2_SERVICE_IAM_MEMBER,
    CLOUDSCHEDULER_JOB,
    COMPONENT_PREFIX,
    COMPUTE_FIREWALL,
    COMPUTE_NETWORK,
    COMPUTE_SHARED_VPC_HOST_PROJECT,
    COMPUTE_SHARED_VPC_SERVICE_PROJECT,
    COMPUTE_SUBNETWORK,
    COMPUTE_SUBNETWORK_IAM_MEMBER,
    DYNAMIC_FALLBACK_TPU,
    DYNAMIC_QUEUED_TPU,
    IAM_WORKLOAD_IDENTITY_POOL,
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER,
    PROJECTS_IAM_CUSTOM_ROLE,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    PROJECTS_SERVICE_IDENTITY,
    PROVIDER_PREFIX,
    PUBSUB_SUBSCRIPTION,
    PUBSUB_TOPIC,
    PUBSUB_TOPIC_IAM_MEMBER,
    PULUMI_PREFIX,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_MEMBER,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_BINDING,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from policy.iam import IamModel, binding_target, predefined_roles

OPERATIONS = ("create", "update", "delete")
Inputs = Mapping[str, Any]


@dataclass(frozen=True)
class Row:
    """What each operation on a resource type needs, and where IAM checks it."""

    where: Callable[[Inputs], list[str]]
    create: tuple[str, ...]
    update: tuple[str, ...]
    delete: tuple[str, ...]
    source: str  # the API method's reference
    grant: bool = False  # an IAM grant: its setIamPolicy changes the grant's role
    # Where update and delete are checked when not where create is (the resource itself).
    existing: Callable[[Inputs], list[str]] | None = None

    def needs(self, operation: str) -> tuple[str, ...]:
        return getattr(self, operation)

    def checked_on(self, operation: str, inputs: Inputs) -> list[str]:
        if operation != "create" and self.existing is not None:
            return self.existing(inputs)
        return self.where(inputs)


def _account(inputs: Inputs) -> list[str]:
    return [str(inputs["name"])] if inputs.get("name") else []


def _project(inputs: Inputs) -> list[str]:
    return [f"projects/{inputs['project']}"]


def _bucket(inputs: Inputs) -> list[str]:
    return [f"projects/_/buckets/{str(inputs['bucket']).removeprefix('b/')}"]


def _grant_target(module: str) -> Callable[[Inputs], list[str]]:
    def where(inputs: Inputs) -> list[str]:
        target = binding_target(module, inputs)
        return [target] if target else []
    return where


def _quota_parent(inputs: Inputs) -> list[str]:
    return [str(inputs["parent"])]


def _billing(inputs: Inputs) -> list[str]:
    return [f"billingAccounts/{inputs['billingAccount']}"]


def _topic(inputs: Inputs) -> list[str]:
    return [f"projects/{inputs['project']}/topics/{inputs['topic']}"]


def _run_service(inputs: Inputs) -> list[str]:
    return [f"projects/{inputs['project']}/locations/{inputs['location']}/services/"
            f"{inputs['name']}"]


def _attached(inputs: Inputs) -> list[str]:
    return [f"projects/{inputs['hostProject']}", f"projects/{inputs['serviceProject']}"]


def _scoped_projects(inputs: Inputs) -> list[str]:
    """A MonitoredProject's scoping project and monitored project."""
    return [f"projects/{str(inputs[key]).rsplit('/', 1)[-1]}" for key in ("metricsScope", "name")]


_REST = "cloud.google.com/{}/docs/reference/rest/"
_SET_POLICY = ("resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy")
# The permissions are those each method's reference lists under "IAM Permissions"
# (or, where marked, its service's access-control page).
TABLE: dict[str, Row] = {
    PROJECTS_SERVICE: Row(
        _project, ("serviceusage.services.enable",), (), (),
        "cloud.google.com/service-usage/docs/reference/rest/v1/services/enable (disable: "
        "never called, disable_on_destroy is false)"),
    PROJECTS_SERVICE_IDENTITY: Row(
        # Unconfirmed: the v1beta1 generateServiceIdentity reference names no permission;
        # Service Usage Admin holds both candidates.
        _project, ("serviceusage.services.use",), (), (),
        "cloud.google.com/service-usage/docs/reference/rest/v1beta1/services/"
        "generateServiceIdentity (unconfirmed permission)"),
    COMPUTE_NETWORK: Row(
        _project, ("compute.networks.create",), ("compute.networks.update",),
        ("compute.networks.delete",), _REST.format("compute") + "v1/networks/insert"),
    COMPUTE_SUBNETWORK: Row(
        # Turning Private Google Access on or off is its own method and permission
        # (v1/subnetworks/setPrivateIpGoogleAccess: compute.subnetworks.
        # setPrivateIpGoogleAccess), which an update of that field calls (issue 44).
        _project, ("compute.subnetworks.create",),
        ("compute.subnetworks.update", "compute.subnetworks.setPrivateIpGoogleAccess"),
        ("compute.subnetworks.delete",), _REST.format("compute") + "v1/subnetworks/insert "
        "(update: .../patch and .../setPrivateIpGoogleAccess)"),
    COMPUTE_FIREWALL: Row(
        _project, ("compute.firewalls.create", "compute.networks.updatePolicy"),
        ("compute.firewalls.update", "compute.networks.updatePolicy"),
        ("compute.firewalls.delete", "compute.networks.updatePolicy"),
        _REST.format("compute") + "v1/firewalls/insert"),
    COMPUTE_SHARED_VPC_HOST_PROJECT: Row(
        _project, ("compute.organizations.enableXpnHost",), (),
        ("compute.organizations.disableXpnHost",),
        _REST.format("compute") + "v1/projects/enableXpnHost (checked on the host project's "
        "organization or folder: cloud.google.com/vpc/docs/shared-vpc, Shared VPC Admin)"),
    COMPUTE_SHARED_VPC_SERVICE_PROJECT: Row(
        _attached, ("compute.organizations.enableXpnResource",), (),
        ("compute.organizations.disableXpnResource",),
        _REST.format("compute") + "v1/projects/enableXpnResource (delete: "
        "v1/projects/disableXpnResource, compute.organizations.disableXpnResource)"),
    SERVICEACCOUNT_ACCOUNT: Row(
        _project, ("iam.serviceAccounts.create",), ("iam.serviceAccounts.update",),
        ("iam.serviceAccounts.delete",),
        _REST.format("iam") + "v1/projects.serviceAccounts/create (update, delete: on the "
        "account, .../patch, .../delete)", existing=_account),
    PROJECTS_IAM_CUSTOM_ROLE: Row(
        _project, ("iam.roles.create",), ("iam.roles.update",), ("iam.roles.delete",),
        _REST.format("iam") + "v1/projects.roles/create"),
    IAM_WORKLOAD_IDENTITY_POOL: Row(
        _project, ("iam.googleapis.com/workloadIdentityPools.create",),
        ("iam.googleapis.com/workloadIdentityPools.update",),
        ("iam.googleapis.com/workloadIdentityPools.delete",),
        _REST.format("iam") + "v1/projects.locations.workloadIdentityPools/create"),
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER: Row(
        _project, ("iam.googleapis.com/workloadIdentityPoolProviders.create",),
        ("iam.googleapis.com/workloadIdentityPoolProviders.update",),
        ("iam.googleapis.com/workloadIdentityPoolProviders.delete",),
        _REST.format("iam") + "v1/projects.locations.workloadIdentityPools.providers/create"),
    PROJECTS_IAM_MEMBER: Row(
        _grant_target("projects"), _SET_POLICY, _SET_POLICY, _SET_POLICY,
        _REST.format("resource-manager") + "v3/projects/setIamPolicy", grant=True),
    SERVICEACCOUNT_IAM_MEMBER: Row(
        _grant_target("serviceaccount"), *(("iam.serviceAccounts.getIamPolicy",
                                            "iam.serviceAccounts.setIamPolicy"),) * 3,
        _REST.format("iam") + "v1/projects.serviceAccounts/setIamPolicy", grant=True),
    COMPUTE_SUBNETWORK_IAM_MEMBER: Row(
        _grant_target("compute"), *(("compute.subnetworks.getIamPolicy",
                                     "compute.subnetworks.setIamPolicy"),) * 3,
        _REST.format("compute") + "v1/subnetworks/setIamPolicy", grant=True),
    STORAGE_BUCKET_IAM_MEMBER: Row(
        _bucket, *(("storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy"),) * 3,
        "cloud.google.com/storage/docs/json_api/v1/buckets/setIamPolicy "
        "(cloud.google.com/storage/docs/access-control/iam-json)", grant=True),
    STORAGE_BUCKET_IAM_BINDING: Row(
        _bucket, *(("storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy"),) * 3,
        "cloud.google.com/storage/docs/json_api/v1/buckets/setIamPolicy", grant=True),
    STORAGE_BUCKET: Row(
        _project, ("storage.buckets.create",), ("storage.buckets.update",),
        ("storage.buckets.delete",),
        "cloud.google.com/storage/docs/json_api/v1/buckets/insert "
        "(cloud.google.com/storage/docs/access-control/iam-json)"),
    STORAGE_BUCKET_OBJECT: Row(
        # A changed object is a new upload under the same name: overwriting needs
        # storage.objects.delete too (cloud.google.com/storage/docs/access-control/
        # iam-permissions: objects.insert "also requires storage.objects.delete" to
        # overwrite an existing object).
        _bucket, ("storage.objects.create",), ("storage.objects.create",
                                               "storage.objects.delete"),
        ("storage.objects.delete",),
        "cloud.google.com/storage/docs/json_api/v1/objects/insert "
        "(cloud.google.com/storage/docs/access-control/iam-permissions)"),
    CLOUDQUOTA_S_QUOTA_PREFERENCE: Row(
        _quota_parent, ("cloudquotas.quotas.update",), ("cloudquotas.quotas.update",), (),
        "cloud.google.com/docs/quotas/reference/rest/v1/projects.locations."
        "quotaPreferences/create (a preference is never deleted: Cloud Quotas has no delete)"),
    BILLING_BUDGET: Row(
        _billing, ("billing.budgets.create",), ("billing.budgets.update",),
        ("billing.budgets.delete",),
        "cloud.google.com/billing/docs/reference/budget/rest/v1/billingAccounts.budgets/create"),
    TPU_V2_VM: Row(
        _project, ("tpu.nodes.create",), ("tpu.nodes.update",), ("tpu.nodes.delete",),
        _REST.format("tpu") + "v2/projects.locations.nodes/create"),
    # Unconfirmed: the queued-resources methods' permissions (tpu.queuedResources.*) are
    # in no role of the pinned role table (iann0036/iam-dataset's roles/tpu.admin lists
    # tpu.nodes.* only): the proof checks the node permissions a queued resource's node
    # needs in their place.
    DYNAMIC_QUEUED_TPU: Row(
        _project, ("tpu.nodes.create",), ("tpu.nodes.update",), ("tpu.nodes.delete",),
        _REST.format("tpu") + "v2/projects.locations.queuedResources/create (permission "
        "unconfirmed)"),
    # components/fallback_tpu.py: each candidate a queued resource (as QueuedTpu above).
    DYNAMIC_FALLBACK_TPU: Row(
        _project, ("tpu.nodes.create",), ("tpu.nodes.update",), ("tpu.nodes.delete",),
        _REST.format("tpu") + "v2/projects.locations.queuedResources/create, per candidate "
        "(permission unconfirmed, as QueuedTpu's)"),
    PUBSUB_TOPIC: Row(
        _project, ("pubsub.topics.create",), ("pubsub.topics.update",),
        ("pubsub.topics.delete",), "cloud.google.com/pubsub/docs/reference/rest/v1/"
        "projects.topics/create (patch, delete; cloud.google.com/pubsub/docs/access-control)"),
    PUBSUB_TOPIC_IAM_MEMBER: Row(
        _topic, *(("pubsub.topics.getIamPolicy", "pubsub.topics.setIamPolicy"),) * 3,
        "cloud.google.com/pubsub/docs/reference/rest/v1/projects.topics/setIamPolicy "
        "(cloud.google.com/pubsub/docs/access-control)", grant=True),
    # actAs on the runtime and trigger accounts: RUNS_AS below.
    CLOUDFUNCTIONSV2_FUNCTION: Row(
        _project, ("cloudfunctions.functions.create",), ("cloudfunctions.functions.update",),
        ("cloudfunctions.functions.delete",),
        "cloud.google.com/functions/docs/reference/rest/v2/projects.locations.functions/"
        "create (cloud.google.com/functions/docs/reference/iam/permissions)"),
    CLOUDRUNV2_SERVICE_IAM_MEMBER: Row(
        _run_service, *(("run.services.getIamPolicy", "run.services.setIamPolicy"),) * 3,
        "cloud.google.com/run/docs/reference/rest/v2/projects.locations.services/"
        "setIamPolicy (cloud.google.com/run/docs/reference/iam/permissions)", grant=True),
    # Dashboards and alerts (components/monitoring.py, issue 46).
    "gcp:monitoring/dashboard:Dashboard": Row(
        _project, ("monitoring.dashboards.create",), ("monitoring.dashboards.update",),
        ("monitoring.dashboards.delete",),
        "cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards/create "
        "(patch, delete; cloud.google.com/monitoring/access-control)"),
    "gcp:monitoring/alertPolicy:AlertPolicy": Row(
        _project, ("monitoring.alertPolicies.create",), ("monitoring.alertPolicies.update",),
        ("monitoring.alertPolicies.delete",),
        "cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/create "
        "(patch, delete)"),
    "gcp:monitoring/notificationChannel:NotificationChannel": Row(
        _project, ("monitoring.notificationChannels.create",),
        ("monitoring.notificationChannels.update",), ("monitoring.notificationChannels.delete",),
        "cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.notificationChannels/create "
        "(patch, delete)"),
    "gcp:logging/metric:Metric": Row(
        _project, ("logging.logMetrics.create",), ("logging.logMetrics.update",),
        ("logging.logMetrics.delete",),
        "cloud.google.com/logging/docs/reference/v2/rest/v2/projects.metrics/create "
        "(update, delete; cloud.google.com/logging/docs/access-control)"),
    # Checked on both projects (unconfirmed: the reference as recalled names the scoping
    # project's; the monitored one's is the conservative reading).
    "gcp:monitoring/monitoredProject:MonitoredProject": Row(
        _scoped_projects, *(("monitoring.metricsScopes.link",),) * 3,
        "cloud.google.com/monitoring/api/ref_v3/rest/v1/locations.global.metricsScopes."
        "projects/create (delete: .../projects/delete)"),
    # issue 43, components/controller.py: the controller's schedule and budget pushes.
    "gcp:cloudscheduler/job:Job": Row(
        _project, ("cloudscheduler.jobs.create",), ("cloudscheduler.jobs.update",),
        ("cloudscheduler.jobs.delete",),
        "cloud.google.com/scheduler/docs/reference/rest/v1/projects.locations.jobs/create "
        "(cloud.google.com/scheduler/docs/access-control; its OIDC token's account: RUNS_AS)"),
    "gcp:pubsub/subscription:Subscription": Row(
        _project, ("pubsub.subscriptions.create",), ("pubsub.subscriptions.update",),
        ("pubsub.subscriptions.delete",),
        "cloud.google.com/pubsub/docs/reference/rest/v1/projects.subscriptions/create "
        "(cloud.google.com/pubsub/docs/access-control; its OIDC token's account: RUNS_AS; "
        "pubsub.topics.attachSubscription on the topic too: not proven here)"),
}
# Types nothing applies in GCP (an explicit provider, a stack reference, components).
NO_API = (PROVIDER_PREFIX, PULUMI_PREFIX, COMPONENT_PREFIX)
# The accounts a resource runs as, and the subnetworks it uses: actAs on each account
# (cloud.google.com/iam/docs/service-accounts-actas) and compute.subnetworks.use on each
# subnet (cloud.google.com/vpc/docs/shared-vpc, "Service Project Admins": networkUser).
# A function's deployer needs actAs on its runtime account (cloud.google.com/functions/
# docs/reference/iam/roles, "Additional configuration for deployment") and on its
# trigger's account (Eventarc: a trigger's creator acts as its service account,
# cloud.google.com/eventarc/docs/access-control; as recalled, unconfirmed here).
# A Scheduler job's and a push subscription's OIDC token account: the deployer "must have
# the iam.serviceAccounts.actAs permission for that service account" (cloud.google.com/
# scheduler/docs/http-target-auth), "The caller (for CreateSubscription,
# UpdateSubscription, and ModifyPushConfig RPCs) must have the iam.serviceAccounts.actAs
# permission for the service account" (googleapis google/pubsub/v1/pubsub.proto,
# PushConfig.OidcToken.service_account_email).
RUNS_AS = {TPU_V2_VM: (("serviceAccount", "email"),),
           CLOUDSCHEDULER_JOB: (("httpTarget", "oidcToken", "serviceAccountEmail"),),
           PUBSUB_SUBSCRIPTION: (("pushConfig", "oidcToken", "serviceAccountEmail"),),
           DYNAMIC_QUEUED_TPU: (("service_account_email",),),
           DYNAMIC_FALLBACK_TPU: (("service_account_email",),),
           CLOUDFUNCTIONSV2_FUNCTION: (("serviceConfig", "serviceAccountEmail"),
                                                      ("eventTrigger", "serviceAccountEmail"))}
USES_SUBNET = {TPU_V2_VM: ("networkConfig", "subnetwork"), DYNAMIC_QUEUED_TPU: ("subnetwork",),
               DYNAMIC_FALLBACK_TPU: ("subnetwork",)}


@dataclass(frozen=True)
class Finding:
    """A resource its identity cannot apply."""

    resource: str  # `type name`
    identity: str
    operation: str
    permission: str
    on: str
    fix: str

    def line(self) -> str:
        return (f"{self.resource}: {self.identity} cannot {self.operation} it: missing "
                f"{self.permission} on {self.on}; fix: {self.fix}")

    def to_json(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Applier:
    """Who applies a plan's resources and what GCP knows besides the plan."""

    identity: str  # the principal (`serviceAccount:…`)
    admin_applied: frozenset[str] = frozenset()  # URNs an admin applies (BOOTSTRAP_ROLES)
    # Projects holding the reservations the stack's reserved nodes may use.
    reservation_projects: frozenset[str] = frozenset()
    unchecked: list[str] = field(default_factory=list)  # types without a table row
    self_grants: list[str] = field(default_factory=list)  # grants to the applier (checked)


def prove(resources: Iterable[Mapping[str, Any]], model: IamModel,
          applier: Applier) -> list[Finding]:
    """Every permission `applier` lacks to create, update and delete `resources`."""
    findings: list[Finding] = []
    for resource in resources:
        kind = resource["type"]
        if resource.get("custom") is False or kind.startswith(NO_API):
            continue
        if resource.get("urn") in applier.admin_applied:
            continue
        row = TABLE.get(kind)
        if row is None:
            applier.unchecked.append(kind)
            continue
        inputs = {**(resource.get("outputs") or {}), **(resource.get("inputs") or {})}
        label = f"{kind} {resource.get('name')}"
        if row.grant and inputs.get("member") == applier.identity:
            # A grant to the applier is checked like any other (issue 44): GCP does.
            applier.self_grants.append(label)
        findings += _row_findings(label, row, inputs, model, applier.identity)
        findings += _runs_as_findings(label, kind, inputs, model, applier.identity)
        findings += _reservation_findings(label, kind, inputs, applier)
        findings += _contact_findings(label, kind, inputs, model)
    return _unique(findings)




def _contact_findings(label: str, kind: str, inputs: Inputs, model: IamModel) -> list[Finding]:
    """"The Google account for the email address must have quota update permission for
    the project, folder or organization this quota preference is for" (Cloud Quotas v1
    QuotaPreference.contact_email): the contact, as a group or a user. Unconfirmed: that
    a group's email is accepted there (the API asks for a Google account's email; a
    `user:` contact is the confirmed form, issue 44)."""
    contact = inputs.get("contactEmail") if kind == CLOUDQUOTA_S_QUOTA_PREFERENCE else None
    if not contact:
        return []
    parent, permission = str(inputs["parent"]), "cloudquotas.quotas.update"
    if any(model.can(f"{who}:{contact}", permission, parent) for who in ("group", "user")):
        return []
    return [Finding(label, f"the quota contact {contact}", "create", permission, parent,
                    f"grant roles/cloudquotas.admin on {parent} (or its folder) to "
                    f"user:{contact} (a group: unconfirmed)")]


def _row_findings(label: str, row: Row, inputs: Inputs, model: IamModel,
                  identity: str) -> list[Finding]:
    roles = [str(inputs["role"])] if row.grant and "role" in inputs else []
    found = []
    for operation in OPERATIONS:
        for on in row.checked_on(operation, inputs):
            for permission in row.needs(operation):
                if not model.can(identity, permission, on, roles):
                    found.append(Finding(label, identity, operation, permission, on,
                                         fix_for(model, identity, permission, on, roles)))
    return found


def _runs_as_findings(label: str, kind: str, inputs: Inputs, model: IamModel,
                      identity: str) -> list[Finding]:
    found = []
    emails = [_path(inputs, path) for path in RUNS_AS.get(kind, ())]
    for email in dict.fromkeys(e for e in emails if e):
        account = f"projects/{email.split('@')[1].split('.')[0]}/serviceAccounts/{email}"
        account = _declared(model, email) or account
        for operation in ("create", "update"):
            if not model.can(identity, "iam.serviceAccounts.actAs", account):
                found.append(Finding(label, identity, operation, "iam.serviceAccounts.actAs",
                                     account, f"grant roles/iam.serviceAccountUser on {account} "
                                              f"(that account only)"))
    for subnet in _subnets(kind, inputs):
        if subnet.startswith("projects/") and not model.can(
                identity, "compute.subnetworks.use", subnet):
            found.append(Finding(label, identity, "create", "compute.subnetworks.use", subnet,
                                 f"grant roles/compute.networkUser on {subnet}"))
    return found


def _candidates(kind: str, inputs: Inputs) -> list[Inputs]:
    """A fallback node's candidates (each a queued resource), else the resource itself."""
    if kind == DYNAMIC_FALLBACK_TPU:
        return [inputs, *(c for c in inputs.get("candidates") or () if isinstance(c, Mapping))]
    return [inputs]


def _subnets(kind: str, inputs: Inputs) -> list[str]:
    path = USES_SUBNET.get(kind, ())
    found = (_path(candidate, path) for candidate in _candidates(kind, inputs))
    return list(dict.fromkeys(s for s in found if s))


def _reservation_findings(label: str, kind: str, inputs: Inputs,
                          applier: Applier) -> list[Finding]:
    if kind in (DYNAMIC_QUEUED_TPU, DYNAMIC_FALLBACK_TPU):
        named = {str(c["reservation_name"]): str(c.get("zone") or inputs.get("zone"))
                 for c in _candidates(kind, inputs) if c.get("reservation_name")}
        return [f for name, zone in named.items() for f in _reservation_finding(
            label, name.split("/")[1] if name.startswith("projects/") else inputs.get("project"),
            zone, f"its queued resource names {name}", applier)]
    if kind == TPU_V2_VM and (inputs.get("schedulingConfig") or {}).get("reserved"):
        return _reservation_finding(label, inputs.get("project"), str(inputs.get("zone")),
                                    "a reserved node uses a reservation of its own project",
                                    applier)
    return []


def _reservation_finding(label: str, owner: Any, zone: str, why: str,
                         applier: Applier) -> list[Finding]:
    if f"projects/{owner}" in applier.reservation_projects:
        return []
    holders = ", ".join(sorted(applier.reservation_projects)) or "none"
    where = sorted(applier.reservation_projects)[0].removeprefix("projects/") \
        if applier.reservation_projects else "OWNER"
    return [Finding(label, applier.identity, "create", "a reservation",
                    f"projects/{owner} ({why}; the stack's reservations are in {holders})",
                    f"provisioning: queued with queue.reservationName: "
                    f"projects/{where}/locations/{zone}/reservations/NAME")]


def fix_for(model: IamModel, identity: str, permission: str, on: str,
            roles: list[str]) -> str:
    """The grant that would let `identity` use `permission` on `on`: a conditioned
    binding that holds the permission gets the role added to its condition; otherwise
    the smallest predefined role holding the permission, granted there."""
    for name in model.ancestry(on):
        for binding in model.bindings.get(name, ()):
            if identity in binding.members and binding.condition and _holds_permission(
                    model, binding.role, permission):
                if roles:
                    return (f"add {', '.join(repr(r) for r in roles)} to the hasOnly list of "
                            f"the condition on {binding.role} at {name}")
                return f"widen the condition on {binding.role} at {name}"
    holders = [role for role, permissions in predefined_roles().items()
               if permission in permissions and role not in ("roles/owner", "roles/editor")]
    if not holders:
        return f"a role holding {permission} on {on} (none in policy/iam_roles.json)"
    smallest = min(holders, key=lambda role: (len(predefined_roles()[role]), role))
    return f"grant {smallest} on {on}"


def _holds_permission(model: IamModel, role: str, permission: str) -> bool:
    permissions = model.custom_roles.get(role) or predefined_roles().get(role) or frozenset()
    return permission in permissions


def _declared(model: IamModel, email: str) -> str | None:
    """The account's resource name as the plan declares it (its project may differ
    from the one its email's domain names)."""
    return next((name for name in model.kinds("serviceAccounts") if name.endswith(f"/{email}")),
                None)


def _path(inputs: Inputs, path: tuple[str, ...]) -> str | None:
    value: Any = inputs
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return str(value) if path and value else None


def _unique(findings: list[Finding]) -> list[Finding]:
    seen: dict[tuple[str, ...], Finding] = {}
    for f in findings:
        seen.setdefault((f.resource, f.operation, f.permission, f.on), f)
    return list(seen.values())
