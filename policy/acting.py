"""The identities that act besides the applier, and what IAM itself refuses (issue 44):
the permission proof's second half (policy/permissions.py proves the applier's own
rights to each resource; ops/plan/proof.py runs both).

- a custom role may list only permissions IAM knows (policy/iam_permissions.json, from
  iann0036/iam-dataset): else `400 Permission ... is not valid`
  (terraform-google-modules/terraform-google-iam#158);
- a TPU node in a project whose subnet is another (host) project's is placed by its
  project's TPU service agent, which needs compute.networkUser on the subnet and
  roles/tpu.xpnAgent on the host (terraform-google-modules/terraform-google-project-
  factory modules/shared_vpc_access/main.tf, "Required for Cloud TPU API");
- a Cloud Run function builds as `buildConfig.serviceAccount` (none: the Compute Engine
  default account, which the bootstrap's iam.automaticIamGrantsForDefaultServiceAccounts
  leaves without roles), which needs cloudbuild.builds.create in the function's project
  and storage.objects.get on its source object; the deployer needs actAs on it
  (cloud.google.com/functions/docs/securing/build-custom-sa);
- an Eventarc trigger's account invokes the function's Cloud Run service:
  run.routes.invoke there (roles/run.invoker, cloud.google.com/functions/docs/calling/
  eventarc);
- a budget notifying a Pub/Sub topic: its creator needs pubsub.topics.setIamPolicy on
  the topic (googleapis/googleapis google/cloud/billing/budgets/v1/budget_model.proto,
  NotificationsRule.pubsub_topic: "the caller ... must have pubsub.topics.setIamPolicy
  permission on the topic"), and with the provider's `user_project_override` the
  request is billed to its `billing_project`, which needs serviceusage.services.use
  there (registry.terraform.io/providers/hashicorp/google/latest/docs/guides/
  provider_reference#user_project_override).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from model import shared_reservations
from model.budget_hold import marker_prefix
from model.pulumi_types import (
    BILLING_BUDGET,
    CLOUDFUNCTIONSV2_FUNCTION,
    DYNAMIC_FALLBACK_TPU,
    DYNAMIC_QUEUED_TPU,
    PROJECTS_IAM_CUSTOM_ROLE,
)
from model.roles import BUDGET_STOP_PERMISSIONS
from model.settings.schema import SharedReservationSettings
from policy.iam import IamModel, predefined_roles
from policy.permissions import Applier, Finding, fix_for

PERMISSIONS_FILE = Path(__file__).with_name("iam_permissions.json")
V2VM = "gcp:tpu/v2Vm:V2Vm"
TPU_AGENT_DOMAIN = "@gcp-sa-tpu.iam.gserviceaccount.com"
XPN_AGENT_ROLE = "roles/tpu.xpnAgent"
# iann0036/iam-dataset gcp/map.json: tpu.projects.locations.queuedResources.<method> is
# checked with tpu.nodes.<method>.
_RENAMED = {"tpu.queuedresources.": "tpu.nodes.", "tpu.queuedResources.": "tpu.nodes."}


@cache
def known_permissions() -> tuple[frozenset[str], frozenset[str]]:
    """(every permission, the services covered) of policy/iam_permissions.json."""
    data = json.loads(PERMISSIONS_FILE.read_text())
    return frozenset(data["permissions"]), frozenset(data["services"])


def unknown_permission_fix(permission: str) -> str:
    """What to list instead of a permission IAM does not know."""
    known, services = known_permissions()
    for old, new in _RENAMED.items():
        if permission.startswith(old) and permission.replace(old, new, 1) in known:
            return (f"list {permission.replace(old, new, 1)} instead (iann0036/iam-dataset "
                    f"gcp/map.json: queuedResources methods are checked with tpu.nodes.*)")
    if permission.split(".", 1)[0] not in services:
        return (f"remove {permission}, or add its service to PERMISSION_SERVICES in "
                f"policy/generate_roles.py and regenerate")
    close = difflib.get_close_matches(permission, sorted(known), n=1)
    return f"remove {permission}" + (f" (did you mean {close[0]}?)" if close else "")


def role_findings(label: str, role: str, permissions: Iterable[str],
                  identity: str) -> list[Finding]:
    """A custom role's permissions IAM does not know."""
    known, _ = known_permissions()
    return [Finding(label, identity, "create", permission, role,
                    unknown_permission_fix(permission))
            for permission in permissions if permission not in known]


def custom_role_findings(resources: list[Mapping[str, Any]], applier: Applier,
                         bootstrap_roles: Mapping[str, Iterable[str]]) -> list[Finding]:
    found: list[Finding] = []
    for resource in resources:
        if resource["type"] != PROJECTS_IAM_CUSTOM_ROLE:
            continue
        inputs = resource.get("inputs") or {}
        role = f"projects/{inputs.get('project')}/roles/{inputs.get('roleId')}"
        found += role_findings(f"{PROJECTS_IAM_CUSTOM_ROLE} {resource.get('name')}", role,
                               inputs.get("permissions") or (), applier.identity)
    for role, permissions in bootstrap_roles.items():
        found += role_findings(f"the bootstrap's custom role {role}", role, permissions,
                               "the bootstrap (an admin)")
    return found


def _inputs(resource: Mapping[str, Any]) -> dict[str, Any]:
    return {**(resource.get("outputs") or {}), **(resource.get("inputs") or {})}


def _label(resource: Mapping[str, Any]) -> str:
    return f"{resource['type']} {resource.get('name')}"


def _need(model: IamModel, label: str, who: str, permission: str, on: str,
          fix: str | None = None, operation: str = "create") -> list[Finding]:
    if model.can(who, permission, on):
        return []
    return [Finding(label, who, operation, permission, on,
                    fix or fix_for(model, who, permission, on, []))]


# ---- the TPU service agent ------------------------------------------------------------

def _node_subnets(resource: Mapping[str, Any]) -> list[str]:
    inputs = _inputs(resource)
    if resource["type"] == V2VM:
        subnets = [(inputs.get("networkConfig") or {}).get("subnetwork")]
    else:
        subnets = [inputs.get("subnetwork"),
                   *(c.get("subnetwork") for c in inputs.get("candidates") or ()
                     if isinstance(c, Mapping))]
    return list(dict.fromkeys(str(s) for s in subnets if s))


def _tpu_agents(model: IamModel) -> set[str]:
    return {m for bindings in model.bindings.values() for b in bindings for m in b.members
            if m.endswith(TPU_AGENT_DOMAIN)}


def tpu_agent_findings(resources: list[Mapping[str, Any]], model: IamModel) -> list[Finding]:
    """A node on another project's subnet: its project's TPU agent may use the subnet and
    holds tpu.xpnAgent on the subnet's project. The agent's email holds its project's
    number, which an offline plan does not know: any TPU agent the plan grants counts."""
    found: list[Finding] = []
    agents = sorted(_tpu_agents(model))
    xpn = sorted(predefined_roles()[XPN_AGENT_ROLE])
    for resource in resources:
        if resource["type"] not in (V2VM, DYNAMIC_QUEUED_TPU, DYNAMIC_FALLBACK_TPU):
            continue
        project = _inputs(resource).get("project")
        for subnet in _node_subnets(resource):
            host = "/".join(subnet.split("/")[:2])
            if not subnet.startswith("projects/") or host == f"projects/{project}":
                continue
            agent = f"the TPU service agent of projects/{project}"
            member = f"serviceAccount:service-PROJECT_NUMBER{TPU_AGENT_DOMAIN}"
            if not any(model.can(a, "compute.subnetworks.use", subnet) for a in agents):
                found.append(Finding(_label(resource), agent, "create",
                                     "compute.subnetworks.use", subnet,
                                     f"grant roles/compute.networkUser on {subnet} to {member}"))
            for permission in xpn:
                if not any(model.can(a, permission, host) for a in agents):
                    found.append(Finding(_label(resource), agent, "create", permission, host,
                                         f"grant {XPN_AGENT_ROLE} on {host} to {member}"))
                    break
    return found


# ---- a function's build and trigger accounts ------------------------------------------

def _account_name(value: str) -> str:
    if value.startswith("projects/"):
        return value
    project = value.split("@", 1)[1].split(".", 1)[0]
    return f"projects/{project}/serviceAccounts/{value}"


def function_findings(resources: list[Mapping[str, Any]], model: IamModel,
                      applier: Applier) -> list[Finding]:
    found: list[Finding] = []
    for resource in resources:
        if resource["type"] != CLOUDFUNCTIONSV2_FUNCTION:
            continue
        inputs, label = _inputs(resource), _label(resource)
        project, build = f"projects/{inputs['project']}", inputs.get("buildConfig") or {}
        account = build.get("serviceAccount")
        if not account:
            found.append(Finding(
                label, "the Compute Engine default account", "create",
                "cloudbuild.builds.create", project,
                "set buildConfig.serviceAccount to a build account of its own holding "
                "roles/cloudbuild.builds.builder (cloud.google.com/functions/docs/securing/"
                "build-custom-sa): the default account has no roles here"))
        else:
            name = _account_name(str(account))
            builder = f"serviceAccount:{name.rsplit('/', 1)[-1]}"
            found += _need(model, label, applier.identity, "iam.serviceAccounts.actAs", name,
                           f"grant roles/iam.serviceAccountUser on {name} (that account only)")
            found += _need(model, label, builder, "cloudbuild.builds.create", project)
            source = (build.get("source") or {}).get("storageSource") or {}
            if source.get("bucket") and source.get("object"):
                found += _need(model, label, builder, "storage.objects.get",
                               f"projects/_/buckets/{source['bucket']}/objects/{source['object']}")
        found += runtime_findings(label, inputs, model)
        trigger = (inputs.get("eventTrigger") or {}).get("serviceAccountEmail")
        if trigger:
            service = (f"projects/{inputs['project']}/locations/{inputs['location']}/services/"
                       f"{inputs['name']}")
            found += _need(model, label, f"serviceAccount:{trigger}", "run.routes.invoke",
                           service, f"grant roles/run.invoker on {service} to "
                                    f"serviceAccount:{trigger}")
    return found


def runtime_findings(label: str, inputs: Mapping[str, Any], model: IamModel) -> list[Finding]:
    """The budget-stop function's runtime account (functions/budget_stop: its environment
    names the team's project and marker bucket) holds what its code calls: the TPU
    permissions in the team's project and creating its markers."""
    config = inputs.get("serviceConfig") or {}
    env, account = config.get("environmentVariables") or {}, config.get("serviceAccountEmail")
    if not (account and env.get("TPU_STACK_PROJECT") and env.get("TPU_STACK_TEAM")):
        return []
    who, project = f"serviceAccount:{account}", f"projects/{env['TPU_STACK_PROJECT']}"
    found = [f for p in BUDGET_STOP_PERMISSIONS for f in _need(model, label, who, p, project)]
    if env.get("TPU_STACK_MARKER_BUCKET"):
        marker = (f"projects/_/buckets/{env['TPU_STACK_MARKER_BUCKET']}/objects/"
                  f"{marker_prefix(str(env['TPU_STACK_TEAM']))}marker.json")
        found += _need(model, label, who, "storage.objects.create", marker)
    return found


# ---- a budget's topic and billing project ---------------------------------------------

def budget_findings(resources: list[Mapping[str, Any]], model: IamModel,
                    applier: Applier) -> list[Finding]:
    found: list[Finding] = []
    billing_projects = sorted({str(_inputs(r)["billingProject"]) for r in resources
                               if r["type"] == "pulumi:providers:gcp"
                               and str(_inputs(r).get("userProjectOverride")).lower() == "true"
                               and _inputs(r).get("billingProject")})
    for resource in resources:
        if resource["type"] != BILLING_BUDGET:
            continue
        inputs, label = _inputs(resource), _label(resource)
        topic = (inputs.get("allUpdatesRule") or {}).get("pubsubTopic")
        if topic:
            for operation in ("create", "update"):
                found += _need(model, label, applier.identity, "pubsub.topics.setIamPolicy",
                               str(topic), operation=operation)
        for project in billing_projects:
            found += _need(model, label, applier.identity, "serviceusage.services.use",
                           f"projects/{project}")
    return found


# ---- grants IAM refuses outright -------------------------------------------------------

BASIC_ROLES = ("roles/owner", "roles/editor", "roles/viewer")
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")


def conditional_grant_findings(resources: list[Mapping[str, Any]],
                               applier: Applier) -> list[Finding]:
    """A condition on a basic role, or on allUsers / allAuthenticatedUsers: IAM refuses
    the binding (cloud.google.com/iam/docs/conditions-overview, "Limitations": basic
    roles and public principals cannot take conditions)."""
    found = []
    for resource in resources:
        inputs = _inputs(resource)
        if not (inputs.get("condition") and "role" in inputs):
            continue
        members = [inputs["member"]] if "member" in inputs else list(inputs.get("members") or ())
        public = [m for m in members if m in PUBLIC_MEMBERS]
        if inputs["role"] in BASIC_ROLES or public:
            what = inputs["role"] if inputs["role"] in BASIC_ROLES else public[0]
            found.append(Finding(_label(resource), applier.identity, "create",
                                 "a conditional grant", f"{what} (IAM takes no condition here)",
                                 "drop the condition, or grant a predefined role to a "
                                 "named principal"))
    return found


# ---- another project's reservation -----------------------------------------------------

@dataclass(frozen=True)
class Sharing:
    """The shared reservations a stack declares, and the owners the bootstrap allows."""

    declared: tuple[SharedReservationSettings, ...] = ()
    allowed: tuple[str, ...] = ()


def reservation_findings(resources: list[Mapping[str, Any]], applier: Applier,
                         sharing: Sharing) -> list[Finding]:
    """A queued resource (a fallback node's candidate) naming another project's
    reservation: one refusal naming what is missing (model/shared_reservations.py)."""
    found = []
    for resource in resources:
        if resource["type"] not in (DYNAMIC_QUEUED_TPU, DYNAMIC_FALLBACK_TPU):
            continue
        inputs = _inputs(resource)
        candidates = [inputs, *(c for c in inputs.get("candidates") or ()
                                if isinstance(c, Mapping))]
        names = dict.fromkeys(str(c["reservation_name"]) for c in candidates
                              if c.get("reservation_name"))
        for name in names:
            gap = shared_reservations.missing(name, str(inputs.get("project")),
                                              list(sharing.declared), list(sharing.allowed))
            if gap is not None:
                found.append(Finding(_label(resource), applier.identity, "create",
                                     "a shared reservation", f"{name} ({gap.what})", gap.fix))
    return found


# ---- no role-content escape ----------------------------------------------------------

def role_escalation_findings(model: IamModel, applier: Applier) -> list[Finding]:
    """A custom role the applier may grant and may also edit (iam.roles.update where the
    role lives): it could add any permission to the role, then grant it, to itself
    included. modifiedGrantsByRole limits which role names a request changes, never
    what they hold (cloud.google.com/iam/docs/setting-limits-on-granting-roles)."""
    found = []
    for role in sorted(model.custom_roles):
        if not role.startswith("projects/"):
            continue
        project = "/".join(role.split("/")[:2])
        places = [project, *model.kinds("buckets")]
        if not any(model.can_grant(applier.identity, role, place) for place in places):
            continue
        if model.can(applier.identity, "iam.roles.update", project):
            found.append(Finding(
                f"the custom role {role}", applier.identity, "update", "iam.roles.update",
                project, "an escalation: it may grant this role and edit what it holds; "
                "remove roles/iam.roleAdmin from its grants there and let the bootstrap "
                "create the role with a fixed permission list (model/bootstrap.py "
                "custom_roles)"))
    return found


def prove_acting(resources: list[Mapping[str, Any]], model: IamModel, applier: Applier,
                 bootstrap_roles: Mapping[str, Iterable[str]],
                 sharing: Sharing = Sharing()) -> list[Finding]:
    """Every refusal of an identity other than the applier's own table rows."""
    mine = [r for r in resources if r.get("urn") not in applier.admin_applied]
    return [*custom_role_findings(resources, applier, bootstrap_roles),
            *tpu_agent_findings(mine, model),
            *function_findings(mine, model, applier),
            *budget_findings(mine, model, applier),
            *reservation_findings(mine, applier, sharing),
            *conditional_grant_findings(mine, applier),
            *role_escalation_findings(model, applier)]
