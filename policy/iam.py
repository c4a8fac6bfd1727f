"""Who may do what, from the IAM a plan declares: "can principal P use permission X
on resource R?".

Pure: it reads resources as the offline plan records them (type, inputs,
outputs; ops/plan/mock_engine.py) and knows nothing of Pulumi. It collects the
allow bindings the plan declares at organization, folder, project, bucket,
service-account and subnetwork level (IAMMember, IAMBinding, IAMPolicy), and
the custom roles it defines; predefined roles map to permissions through the
vendored table policy/iam_roles.json (sources there). A binding on an ancestor
applies to its descendants (cloud.google.com/iam/docs/resource-hierarchy-access-
control): a bucket, service account, subnetwork or TPU node is in its project,
a project in its folder or organization.

Conditions are evaluated with policy/cel.py against the request: `resource.name`
is the name of the resource the request is about, and `api.getAttribute(
'iam.googleapis.com/modifiedGrantsByRole', [])` the roles a setIamPolicy request
on a project, folder or organization adds or removes (cloud.google.com/iam/docs/
setting-limits-on-granting-roles; elsewhere the attribute is absent and the
default is returned). A condition whose evaluation errs grants nothing, as in IAM.
Resource attributes (`resource.name`, `.type`, `.service`) exist only for the
services cloud.google.com/iam/docs/conditions-resource-attributes lists ("Other
services and resource types do not recognize resource attributes"): a condition
that reads one never holds for a permission of another service (iam.*, tpu.*),
however its text reads.

Resource names follow IAM Conditions (cloud.google.com/iam/docs/conditions-
resource-attributes): `projects/_/buckets/<bucket>`,
`projects/<p>/serviceAccounts/<email>`, `projects/<p>/locations/<zone>/nodes/<id>`,
`projects/<p>/regions/<r>/subnetworks/<name>`, `projects/<p>`, `folders/<id>`.
Deny policies, principal access boundaries, groups' membership and what GCP
grants outside the plan (a project's creator, service agents' own roles) are not
modelled: a check here shows what the plan grants, not more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from model.pulumi_types import (
    COMPUTE_SUBNETWORK,
    DYNAMIC_FALLBACK_TPU,
    DYNAMIC_QUEUED_TPU,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_CUSTOM_ROLE,
    PUBSUB_TOPIC,
    SERVICEACCOUNT_ACCOUNT,
    STORAGE_BUCKET,
    TPU_V2_VM,
)
from policy.cel import CelError, evaluate

ROLES_FILE = Path(__file__).with_name("iam_roles.json")
MODIFIED_GRANTS = "iam.googleapis.com/modifiedGrantsByRole"
PUBLIC = frozenset({"allUsers", "allAuthenticatedUsers"})

# The permission that changes a resource's allow policy, by resource kind; a TPU
# node has no allow policy of its own (its project's governs it).
SET_IAM_POLICY = {
    "projects": "resourcemanager.projects.setIamPolicy",
    "folders": "resourcemanager.folders.setIamPolicy",
    "organizations": "resourcemanager.organizations.setIamPolicy",
    "buckets": "storage.buckets.setIamPolicy",
    "serviceAccounts": "iam.serviceAccounts.setIamPolicy",
    "subnetworks": "compute.subnetworks.setIamPolicy",
}
# Resources named projects/P/... that sit in project P whether or not the plan declares
# them (a Cloud Run function's service is made by its function, not by the plan).
_IN_THEIR_PROJECT = ("topics", "functions", "services")
# Where modifiedGrantsByRole is set (setting-limits-on-granting-roles).
_LIMITABLE = ("projects", "folders", "organizations")


# Services whose permissions IAM evaluates resource attributes for, by permission
# prefix (cloud.google.com/iam/docs/conditions-resource-attributes, "Resource
# service values", read 2026-12: apigee, bigquery, bigtableadmin,
# binaryauthorization, cloudkms, cloudresourcemanager, compute, container,
# connectors, firestore, dataform, iap, integrations, logging, pubsublite,
# secretmanager, spanner, sqladmin, storage). Not iam, not tpu.
RESOURCE_ATTRIBUTE_SERVICES = frozenset({
    "apigee", "bigquery", "bigtable", "binaryauthorization", "cloudkms", "resourcemanager",
    "compute", "container", "connectors", "datastore", "dataform", "iap", "integrations",
    "logging", "pubsublite", "secretmanager", "spanner", "cloudsql", "storage"})
_RESOURCE_ATTRIBUTE = re.compile(r"\bresource\.(name|type|service)\b")


def condition_can_hold(condition: str, permission: str) -> bool:
    """False when `condition` reads resource attributes the permission's service
    does not supply: IAM never matches it (the grant is dead, not wider)."""
    service = permission.split(".", 1)[0]
    return service in RESOURCE_ATTRIBUTE_SERVICES or not _RESOURCE_ATTRIBUTE.search(condition)


class UnknownRoleError(KeyError):
    """A role the plan grants that neither the table nor the plan's custom roles know."""


@cache
def predefined_roles() -> dict[str, frozenset[str]]:
    roles = json.loads(ROLES_FILE.read_text())["roles"]
    return {name: frozenset(entry["permissions"]) for name, entry in roles.items()}


@dataclass(frozen=True)
class Binding:
    resource: str
    role: str
    members: frozenset[str]
    condition: str | None = None


@dataclass
class IamModel:
    bindings: dict[str, list[Binding]] = field(default_factory=dict)  # resource → bindings
    parents: dict[str, str] = field(default_factory=dict)  # resource → its parent
    custom_roles: dict[str, frozenset[str]] = field(default_factory=dict)
    # Grants whose role the plan cannot know yet (an output of another resource the
    # offline engine does not compute): they grant nothing here, so a check on a
    # model with any should fail.
    unresolved: list[Mapping[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, resources: Iterable[Any]) -> IamModel:
        """From plan resources: Registrations, or dicts with type, inputs and outputs."""
        model = cls()
        for resource in resources:
            kind, inputs, outputs = _fields(resource)
            model._add(kind, inputs, outputs)
        return model

    def kinds(self, kind: str) -> list[str]:
        """Every resource of a kind (`buckets`, `serviceAccounts`, `nodes`, `projects`…)."""
        names = set(self.parents) | set(self.bindings)
        return sorted(n for n in names if kind_of(n) == kind)

    def project_of(self, resource: str) -> str | None:
        for name in self.ancestry(resource):
            if kind_of(name) == "projects":
                return name
        return None

    def ancestry(self, resource: str) -> list[str]:
        """The resource and its ancestors; an object (`…/buckets/b/objects/o`) is in
        its bucket whether or not the plan declares it."""
        chain = [resource]
        while len(chain) < 10:
            parent = self.parents.get(chain[-1])
            if parent is None and kind_of(chain[-1]) == "objects":
                parent = chain[-1].split("/objects/", 1)[0]
            if parent is None and kind_of(chain[-1]) in _IN_THEIR_PROJECT:
                parent = "/".join(chain[-1].split("/")[:2])
            if parent is None:
                break
            chain.append(parent)
        return chain

    def can(self, principal: str, permission: str, resource: str,
            modified_roles: Iterable[str] = ()) -> bool:
        """Whether a binding on `resource` or an ancestor lets `principal` use
        `permission` on it (a setIamPolicy request changing `modified_roles`)."""
        modified = list(modified_roles)
        attributes = {MODIFIED_GRANTS: modified} if kind_of(resource) in _LIMITABLE else {}
        for name in self.ancestry(resource):
            for binding in self.bindings.get(name, ()):
                if not (principal in binding.members or binding.members & PUBLIC):
                    continue
                if not self._grants(binding.role, permission):
                    continue
                condition = binding.condition
                if condition is None or (condition_can_hold(condition, permission)
                                         and _holds(condition, resource, attributes)):
                    return True
        return False

    def can_grant(self, principal: str, role: str, resource: str) -> bool:
        """Whether `principal` may add a binding of `role` to `resource`'s allow policy."""
        permission = SET_IAM_POLICY.get(kind_of(resource))
        return permission is not None and self.can(principal, permission, resource, [role])

    def roles(self) -> set[str]:
        return {b.role for bindings in self.bindings.values() for b in bindings}

    def _grants(self, role: str, permission: str) -> bool:
        permissions = self.custom_roles.get(role) or predefined_roles().get(role)
        if permissions is None:
            raise UnknownRoleError(f"{role}: not in policy/iam_roles.json nor a custom role "
                                   f"of the plan; add it with its source")
        return permission in permissions or "*" in permissions

    # ---- reading the plan ---------------------------------------------------

    def _add(self, kind: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        module, _, name = kind.partition(":")[2].partition("/")
        name = name.split(":", 1)[0].lower()
        if kind == ORGANIZATIONS_PROJECT:
            self._project(inputs)
        elif kind == PROJECTS_IAM_CUSTOM_ROLE:
            role = outputs.get("name") or f"projects/{inputs['project']}/roles/{inputs['roleId']}"
            self.custom_roles[role] = frozenset(inputs.get("permissions") or ())
        elif name.endswith(("iammember", "iambinding", "iampolicy")):
            target = binding_target(module, inputs)
            if target is not None and "role" not in inputs and "policyData" not in inputs:
                self.unresolved.append(inputs)
            elif target is not None:
                for binding in _bindings(target, inputs):
                    self.bindings.setdefault(target, []).append(binding)
        else:
            child = _resource_name(kind, inputs, outputs)
            if child is not None and inputs.get("project"):
                self.parents.setdefault(child, f"projects/{inputs['project']}")

    def _project(self, inputs: Mapping[str, Any]) -> None:
        project = f"projects/{inputs['projectId']}"
        if inputs.get("folderId"):
            folder = str(inputs["folderId"])
            self.parents[project] = folder if folder.startswith("folders/") else f"folders/{folder}"
        elif inputs.get("orgId"):
            self.parents[project] = f"organizations/{inputs['orgId']}"


def kind_of(resource: str) -> str:
    """`projects/p/serviceAccounts/x` → serviceAccounts; `projects/p` → projects;
    `projects/_/buckets/b/objects/a/b.json` → objects (object names hold slashes)."""
    if "/objects/" in resource:
        return "objects"
    parts = resource.split("/")
    return parts[-2] if len(parts) >= 2 else ""


def _fields(resource: Any) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
    if isinstance(resource, Mapping):
        return resource["type"], resource.get("inputs") or {}, resource.get("outputs") or {}
    return resource.type, resource.inputs, getattr(resource, "outputs", {}) or {}


def _resource_name(kind: str, inputs: Mapping[str, Any],
                   outputs: Mapping[str, Any]) -> str | None:
    project = inputs.get("project")
    if kind == STORAGE_BUCKET:
        return f"projects/_/buckets/{inputs['name']}"
    if kind == SERVICEACCOUNT_ACCOUNT:
        return outputs.get("name") or None
    if kind == TPU_V2_VM:
        return f"projects/{project}/locations/{inputs['zone']}/nodes/{inputs['name']}"
    if kind in (DYNAMIC_QUEUED_TPU, DYNAMIC_FALLBACK_TPU):  # the node its request becomes
        return f"projects/{project}/locations/{inputs['zone']}/nodes/{inputs['node_id']}"
    if kind == COMPUTE_SUBNETWORK:
        return f"projects/{project}/regions/{inputs['region']}/subnetworks/{inputs['name']}"
    if kind == PUBSUB_TOPIC:
        return f"projects/{project}/topics/{inputs['name']}"
    return None


def binding_target(module: str, inputs: Mapping[str, Any]) -> str | None:
    """The IAM resource name a grant of pulumi-gcp `module` (`projects`, `storage`…) sets."""
    if module == "projects":
        return f"projects/{inputs['project']}"
    if module == "folder":
        folder = str(inputs["folder"])
        return folder if folder.startswith("folders/") else f"folders/{folder}"
    if module == "organizations":
        return f"organizations/{inputs['orgId']}"
    if module == "storage" and "bucket" in inputs:
        return f"projects/_/buckets/{str(inputs['bucket']).removeprefix('b/')}"
    if module == "serviceaccount":
        return str(inputs["serviceAccountId"])
    if module == "cloudrunv2" and "name" in inputs:  # a Cloud Run service's own policy
        return (f"projects/{inputs['project']}/locations/{inputs['location']}/services/"
                f"{inputs['name']}")
    if module == "compute" and "subnetwork" in inputs:
        subnet = str(inputs["subnetwork"])
        if subnet.startswith("projects/"):
            return subnet
        return f"projects/{inputs['project']}/regions/{inputs['region']}/subnetworks/{subnet}"
    return None


def _bindings(target: str, inputs: Mapping[str, Any]) -> list[Binding]:
    if "policyData" in inputs:
        policy = json.loads(inputs["policyData"])
        return [Binding(target, b["role"], frozenset(b.get("members", ())),
                        (b.get("condition") or {}).get("expression"))
                for b in policy.get("bindings", [])]
    members = [inputs["member"]] if "member" in inputs else list(inputs.get("members") or ())
    condition = (inputs.get("condition") or {}).get("expression")
    return [Binding(target, inputs["role"], frozenset(members), condition)]


def _holds(condition: str, resource: str, attributes: Mapping[str, Any]) -> bool:
    try:
        return evaluate(condition, {"resource": {"name": resource}}, attributes) is True
    except CelError:
        return False
