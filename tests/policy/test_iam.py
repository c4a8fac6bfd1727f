"""policy/iam.py on hand-written plans: the hierarchy, each binding kind, conditions."""

from __future__ import annotations

import json

import pytest

from model.pulumi_types import (
    DYNAMIC_QUEUED_TPU,
    FOLDER_IAM_MEMBER,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_CUSTOM_ROLE,
    PROJECTS_IAM_MEMBER,
    PROJECTS_IAM_POLICY,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_BINDING,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    TPU_V2_VM,
)
from policy.iam import IamModel, UnknownRoleError, predefined_roles

ANA, BOB = "user:ana@acme.example", "user:bob@acme.example"
SA = "projects/p1/serviceAccounts/run@p1.iam.gserviceaccount.com"
NODE = "projects/p1/locations/us-central1-a/nodes/n1"
BUCKET = "projects/_/buckets/b1"


def plan(*grants: dict) -> IamModel:
    return IamModel.of([
        {"type": ORGANIZATIONS_PROJECT, "inputs": {"projectId": "p1",
                                                                 "folderId": "77"}},
        {"type": STORAGE_BUCKET, "inputs": {"name": "b1", "project": "p1"}},
        {"type": SERVICEACCOUNT_ACCOUNT, "inputs": {"project": "p1"},
         "outputs": {"name": SA}},
        {"type": TPU_V2_VM, "inputs": {"project": "p1", "zone": "us-central1-a",
                                                 "name": "n1"}},
        *grants])


def member(kind: str, role: str, who: str = ANA, condition: str | None = None,
           **target: str) -> dict:
    inputs = {"role": role, "member": who, **target}
    if condition:
        inputs["condition"] = {"title": "t", "expression": condition}
    return {"type": kind, "inputs": inputs}


def test_a_folder_grant_reaches_the_project_and_everything_in_it() -> None:
    model = plan(member(FOLDER_IAM_MEMBER, "roles/tpu.admin", folder="folders/77"))
    assert model.ancestry(NODE) == [NODE, "projects/p1", "folders/77"]
    assert model.can(ANA, "tpu.nodes.update", NODE)
    assert not model.can(BOB, "tpu.nodes.update", NODE)
    assert not model.can(ANA, "storage.objects.get", BUCKET)  # not in tpu.admin


def test_resource_level_grants_stay_on_their_resource() -> None:
    model = plan(member(STORAGE_BUCKET_IAM_MEMBER,
                        "roles/storage.objectViewer", bucket="b1"),
                 {"type": SERVICEACCOUNT_IAM_BINDING,
                  "inputs": {"role": "roles/iam.serviceAccountUser", "members": [BOB],
                             "serviceAccountId": SA}})
    assert model.can(ANA, "storage.objects.get", BUCKET)
    assert not model.can(ANA, "storage.objects.create", BUCKET)
    assert not model.can(ANA, "storage.objects.get", "projects/_/buckets/other")
    assert model.can(BOB, "iam.serviceAccounts.actAs", SA)
    assert not model.can(BOB, "iam.serviceAccounts.actAs", "projects/p1")


def test_a_policy_document_and_a_custom_role() -> None:
    policy = {"bindings": [{"role": "projects/p1/roles/mine", "members": [ANA]}]}
    model = plan({"type": PROJECTS_IAM_CUSTOM_ROLE,
                  "inputs": {"project": "p1", "roleId": "mine",
                             "permissions": ["storage.objects.create"]}},
                 {"type": PROJECTS_IAM_POLICY,
                  "inputs": {"project": "p1", "policyData": json.dumps(policy)}})
    assert model.can(ANA, "storage.objects.create", BUCKET)
    assert not model.can(ANA, "storage.objects.get", BUCKET)


def test_modified_grants_limit_what_an_iam_admin_grants() -> None:
    condition = ("api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
                 ".hasOnly(['roles/tpu.viewer'])")
    model = plan(member(PROJECTS_IAM_MEMBER,
                        "roles/resourcemanager.projectIamAdmin", condition=condition,
                        project="p1"))
    assert model.can_grant(ANA, "roles/tpu.viewer", "projects/p1")
    assert not model.can_grant(ANA, "roles/owner", "projects/p1")
    assert not model.can_grant(ANA, "roles/tpu.viewer", BUCKET)  # no bucket rights at all
    assert not model.can_grant(ANA, "roles/tpu.viewer", NODE)  # nodes have no allow policy


def test_a_resource_name_condition_holds_only_where_gcp_supplies_resource_names() -> None:
    """Cloud Storage supports resource attributes in conditions; IAM (service
    accounts) does not, so there the condition never holds, whatever it says
    (cloud.google.com/iam/docs/conditions-resource-attributes)."""
    model = plan(member(PROJECTS_IAM_MEMBER, "roles/iam.serviceAccountAdmin",
                        condition="resource.name.endsWith('/serviceAccounts/run@p1.iam."
                                  "gserviceaccount.com')", project="p1"),
                 member(PROJECTS_IAM_MEMBER, "roles/storage.objectViewer",
                        condition="resource.name.startsWith('projects/_/buckets/b1/objects/"
                                  "team-a/')", project="p1"),
                 member(PROJECTS_IAM_MEMBER, "roles/tpu.admin", who=BOB,
                        condition="request.time == 'x'", project="p1"))
    assert not model.can(ANA, "iam.serviceAccounts.setIamPolicy", SA)
    assert not model.can(ANA, "iam.serviceAccounts.setIamPolicy",
                         "projects/p1/serviceAccounts/other@p1.iam.gserviceaccount.com")
    assert model.can(ANA, "storage.objects.get", BUCKET + "/objects/team-a/x.json")
    assert not model.can(ANA, "storage.objects.get", BUCKET + "/objects/team-b/x.json")
    assert not model.can(BOB, "tpu.nodes.get", NODE)  # no `request` here: an error denies


def test_a_queued_node_is_in_its_project() -> None:
    model = plan({"type": DYNAMIC_QUEUED_TPU,
                  "inputs": {"project": "p1", "zone": "us-central1-a", "node_id": "q1"}},
                 member(PROJECTS_IAM_MEMBER, "roles/tpu.admin", project="p1"))
    assert model.kinds("nodes") == ["projects/p1/locations/us-central1-a/nodes/n1",
                                    "projects/p1/locations/us-central1-a/nodes/q1"]
    assert model.can(ANA, "tpu.nodes.delete", "projects/p1/locations/us-central1-a/nodes/q1")


def test_public_members_reach_everyone_and_unknown_roles_are_refused() -> None:
    model = plan(member(STORAGE_BUCKET_IAM_MEMBER, "roles/storage.objectViewer",
                        who="allUsers", bucket="b1"),
                 member(PROJECTS_IAM_MEMBER, "roles/made.up", project="p1"))
    assert model.can(BOB, "storage.objects.get", BUCKET)
    with pytest.raises(UnknownRoleError, match=r"roles/made\.up"):
        model.can(ANA, "tpu.nodes.get", NODE)


def test_the_table_is_generated_from_a_pinned_dataset_of_every_role_granted() -> None:
    """policy/generate_roles.py writes it: a source pinned by commit, and exactly the
    roles the components grant plus the tests' escalation roles, so a grant added
    without regenerating fails here (and UnknownRoleError fails its plan)."""
    from policy.generate_roles import DATASET_COMMIT, DATASET_REPO, granted_roles
    from policy.iam import ROLES_FILE

    data = json.loads(ROLES_FILE.read_text())
    assert data["source"] == {"repo": DATASET_REPO, "commit": DATASET_COMMIT,
                              "path": "gcp/roles/<role>.json"}
    assert len(DATASET_COMMIT) == 40
    assert sorted(data["roles"]) == granted_roles() == sorted(predefined_roles())
    for name, entry in data["roles"].items():
        assert entry["title"] and entry["stage"] and entry["permissions"], name
        assert entry["permissions"] == sorted(set(entry["permissions"])), name


def test_the_generated_table_knows_what_the_typed_one_missed() -> None:
    """roles/tpu.xpnAgent has 22 permissions (firewalls, networks.updatePolicy…),
    not 3; compute.securityAdmin cannot set a subnet's IAM policy; cloudquotas.admin
    has no serviceusage.quotas.update."""
    roles = predefined_roles()
    assert len(roles["roles/tpu.xpnAgent"]) == 22
    assert {"compute.firewalls.create", "compute.networks.updatePolicy",
            "compute.addresses.createInternal"} <= roles["roles/tpu.xpnAgent"]
    assert "compute.subnetworks.setIamPolicy" not in roles["roles/compute.securityAdmin"]
    assert "serviceusage.quotas.update" not in roles["roles/cloudquotas.admin"]
