"""policy/iam.py on hand-written plans: the hierarchy, each binding kind, conditions."""

from __future__ import annotations

import json

import pytest

from policy.iam import IamModel, UnknownRoleError, predefined_roles

ANA, BOB = "user:ana@acme.example", "user:bob@acme.example"
SA = "projects/p1/serviceAccounts/run@p1.iam.gserviceaccount.com"
NODE = "projects/p1/locations/us-central1-a/nodes/n1"
BUCKET = "projects/_/buckets/b1"


def plan(*grants: dict) -> IamModel:
    return IamModel.of([
        {"type": "gcp:organizations/project:Project", "inputs": {"projectId": "p1",
                                                                 "folderId": "77"}},
        {"type": "gcp:storage/bucket:Bucket", "inputs": {"name": "b1", "project": "p1"}},
        {"type": "gcp:serviceaccount/account:Account", "inputs": {"project": "p1"},
         "outputs": {"name": SA}},
        {"type": "gcp:tpu/v2Vm:V2Vm", "inputs": {"project": "p1", "zone": "us-central1-a",
                                                 "name": "n1"}},
        *grants])


def member(kind: str, role: str, who: str = ANA, condition: str | None = None,
           **target: str) -> dict:
    inputs = {"role": role, "member": who, **target}
    if condition:
        inputs["condition"] = {"title": "t", "expression": condition}
    return {"type": kind, "inputs": inputs}


def test_a_folder_grant_reaches_the_project_and_everything_in_it() -> None:
    model = plan(member("gcp:folder/iAMMember:IAMMember", "roles/tpu.admin", folder="folders/77"))
    assert model.ancestry(NODE) == [NODE, "projects/p1", "folders/77"]
    assert model.can(ANA, "tpu.nodes.update", NODE)
    assert not model.can(BOB, "tpu.nodes.update", NODE)
    assert not model.can(ANA, "storage.objects.get", BUCKET)  # not in tpu.admin


def test_resource_level_grants_stay_on_their_resource() -> None:
    model = plan(member("gcp:storage/bucketIAMMember:BucketIAMMember",
                        "roles/storage.objectViewer", bucket="b1"),
                 {"type": "gcp:serviceaccount/iAMBinding:IAMBinding",
                  "inputs": {"role": "roles/iam.serviceAccountUser", "members": [BOB],
                             "serviceAccountId": SA}})
    assert model.can(ANA, "storage.objects.get", BUCKET)
    assert not model.can(ANA, "storage.objects.create", BUCKET)
    assert not model.can(ANA, "storage.objects.get", "projects/_/buckets/other")
    assert model.can(BOB, "iam.serviceAccounts.actAs", SA)
    assert not model.can(BOB, "iam.serviceAccounts.actAs", "projects/p1")


def test_a_policy_document_and_a_custom_role() -> None:
    policy = {"bindings": [{"role": "projects/p1/roles/mine", "members": [ANA]}]}
    model = plan({"type": "gcp:projects/iAMCustomRole:IAMCustomRole",
                  "inputs": {"project": "p1", "roleId": "mine",
                             "permissions": ["storage.objects.create"]}},
                 {"type": "gcp:projects/iAMPolicy:IAMPolicy",
                  "inputs": {"project": "p1", "policyData": json.dumps(policy)}})
    assert model.can(ANA, "storage.objects.create", BUCKET)
    assert not model.can(ANA, "storage.objects.get", BUCKET)


def test_modified_grants_limit_what_an_iam_admin_grants() -> None:
    condition = ("api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
                 ".hasOnly(['roles/tpu.viewer'])")
    model = plan(member("gcp:projects/iAMMember:IAMMember",
                        "roles/resourcemanager.projectIamAdmin", condition=condition,
                        project="p1"))
    assert model.can_grant(ANA, "roles/tpu.viewer", "projects/p1")
    assert not model.can_grant(ANA, "roles/owner", "projects/p1")
    assert not model.can_grant(ANA, "roles/tpu.viewer", BUCKET)  # no bucket rights at all
    assert not model.can_grant(ANA, "roles/tpu.viewer", NODE)  # nodes have no allow policy


def test_a_resource_name_condition_and_an_erring_one() -> None:
    model = plan(member("gcp:projects/iAMMember:IAMMember", "roles/iam.serviceAccountAdmin",
                        condition="resource.name.endsWith('/serviceAccounts/run@p1.iam."
                                  "gserviceaccount.com')", project="p1"),
                 member("gcp:projects/iAMMember:IAMMember", "roles/tpu.admin", who=BOB,
                        condition="request.time == 'x'", project="p1"))
    assert model.can(ANA, "iam.serviceAccounts.setIamPolicy", SA)
    assert not model.can(ANA, "iam.serviceAccounts.setIamPolicy",
                         "projects/p1/serviceAccounts/other@p1.iam.gserviceaccount.com")
    assert not model.can(BOB, "tpu.nodes.get", NODE)  # no `request` here: an error denies


def test_a_queued_node_is_in_its_project() -> None:
    model = plan({"type": "pulumi-python:dynamic/tpu:QueuedTpu",
                  "inputs": {"project": "p1", "zone": "us-central1-a", "node_id": "q1"}},
                 member("gcp:projects/iAMMember:IAMMember", "roles/tpu.admin", project="p1"))
    assert model.kinds("nodes") == ["projects/p1/locations/us-central1-a/nodes/n1",
                                    "projects/p1/locations/us-central1-a/nodes/q1"]
    assert model.can(ANA, "tpu.nodes.delete", "projects/p1/locations/us-central1-a/nodes/q1")


def test_public_members_reach_everyone_and_unknown_roles_are_refused() -> None:
    model = plan(member("gcp:storage/bucketIAMMember:BucketIAMMember", "roles/storage.objectViewer",
                        who="allUsers", bucket="b1"),
                 member("gcp:projects/iAMMember:IAMMember", "roles/made.up", project="p1"))
    assert model.can(BOB, "storage.objects.get", BUCKET)
    with pytest.raises(UnknownRoleError, match=r"roles/made\.up"):
        model.can(ANA, "tpu.nodes.get", NODE)


def test_the_table_cites_a_source_for_every_role() -> None:
    from policy.iam import ROLES_FILE

    roles = json.loads(ROLES_FILE.read_text())["roles"]
    assert set(roles) == set(predefined_roles())
    for name, entry in roles.items():
        assert entry["source"] and entry["permissions"], name
