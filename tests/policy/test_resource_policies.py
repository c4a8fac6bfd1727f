"""Each resource policy: compliant, violating, a missing property, a config override."""

from __future__ import annotations

import json

from model.pulumi_types import (
    DYNAMIC_RESOURCE,
    PROJECTS_IAM_BINDING,
    PROJECTS_IAM_MEMBER,
    PROJECTS_IAM_POLICY,
    PROJECTS_SERVICE,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_KEY,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_IAM_POLICY,
)
from model.pulumi_types import STORAGE_BUCKET as BUCKET
from model.pulumi_types import TPU_V2_VM as V2VM

QUEUED = DYNAMIC_RESOURCE
QUEUED_NODE = {"node_id": "dev-trainer", "runtime_version": "tpu-vm-tf-2.18.0-pjrt",
               "accelerator_type": "v5litepod-8", "spot": True, "enable_external_ips": True,
               "service_account_email": "123-compute@developer.gserviceaccount.com"}
GOOD_BUCKET = {"uniformBucketLevelAccess": True, "publicAccessPrevention": "enforced",
               "forceDestroy": False}


def test_bucket_access_compliant_violating_and_missing(check):
    assert check("bucket-uniform-access", BUCKET, GOOD_BUCKET) == []
    bad = check("bucket-uniform-access", BUCKET,
                {"uniformBucketLevelAccess": False, "publicAccessPrevention": "inherited"})
    assert len(bad) == 2 and "uniformBucketLevelAccess=true" in bad[0]
    assert "'inherited'" in bad[1]
    missing = check("bucket-uniform-access", BUCKET, {})
    assert len(missing) == 2
    assert check("bucket-uniform-access", V2VM, {}) == []


def test_no_public_members_in_member_members_and_policy_data(check):
    member = STORAGE_BUCKET_IAM_MEMBER
    assert check("no-public-members", member, {"member": "user:a@acme.com"}) == []
    assert "allUsers" in check("no-public-members", member, {"member": "allUsers"})[0]
    binding = check("no-public-members", PROJECTS_IAM_BINDING,
                    {"members": ["group:ml@acme.com", "allAuthenticatedUsers"]})
    assert "allAuthenticatedUsers" in binding[0]
    policy_data = json.dumps({"bindings": [{"role": "roles/viewer", "members": ["allUsers"]}]})
    assert check("no-public-members", STORAGE_BUCKET_IAM_POLICY,
                 {"policyData": policy_data})
    assert check("no-public-members", member, {}) == []
    assert check("no-public-members", member, {"policyData": "not json"}) == []


def test_no_service_account_keys(check):
    assert "keys are forbidden" in check("no-service-account-keys",
                                         SERVICEACCOUNT_KEY, {})[0]
    assert check("no-service-account-keys", SERVICEACCOUNT_ACCOUNT, {}) == []


def test_tpu_service_account(check, good_node):
    assert check("tpu-not-default-service-account", V2VM, good_node) == []
    compute_default = "123-compute@developer.gserviceaccount.com"
    default = {**good_node, "serviceAccount": {"email": compute_default}}
    assert "Compute default" in check("tpu-not-default-service-account", V2VM, default)[0]
    missing = check("tpu-not-default-service-account", V2VM, {"acceleratorType": "v2-8"})
    assert "serviceAccount.email is missing" in missing[0]
    assert "Compute default" in check("tpu-not-default-service-account", QUEUED, QUEUED_NODE)[0]
    assert check("tpu-not-default-service-account", QUEUED, {"other": 1}) == [], "not a TPU"


def test_tpu_external_ip(check, good_node):
    exposed = {**good_node, "networkConfig": {"enableExternalIps": True}}
    assert check("tpu-no-external-ip", V2VM, good_node) == []
    assert "enableExternalIps is true" in check("tpu-no-external-ip", V2VM, exposed)[0]
    assert check("tpu-no-external-ip", V2VM, {}) == [], "the API default is no external IP"
    assert check("tpu-no-external-ip", V2VM, exposed, config={"allowedStacks": ["prod"]}) == []
    assert check("tpu-no-external-ip", QUEUED, QUEUED_NODE)


def test_privileged_project_roles(check):
    member = PROJECTS_IAM_MEMBER
    assert check("no-privileged-project-roles", member, {"role": "roles/tpu.viewer"}) == []
    assert "roles/editor" in check("no-privileged-project-roles", member,
                                   {"role": "roles/editor"})[0]
    policy_data = json.dumps({"bindings": [{"role": "roles/owner", "members": ["user:a@b.c"]}]})
    assert check("no-privileged-project-roles", PROJECTS_IAM_POLICY,
                 {"policyData": policy_data})
    assert check("no-privileged-project-roles", member, {}) == []
    bucket_level = STORAGE_BUCKET_IAM_MEMBER
    assert check("no-privileged-project-roles", bucket_level, {"role": "roles/storage.admin"}) == []
    override = {"forbiddenRoles": ["roles/tpu.admin"]}
    assert check("no-privileged-project-roles", member, {"role": "roles/editor"},
                 config=override) == []
    assert check("no-privileged-project-roles", member, {"role": "roles/tpu.admin"},
                 config=override)


def test_protected_data_buckets(check):
    ckpt = {"name": "checkpoints", "props": GOOD_BUCKET}
    assert check("protected-data-buckets", BUCKET, protect=True, **ckpt) == []
    unprotected = check("protected-data-buckets", BUCKET, protect=False, **ckpt)
    assert len(unprotected) == 1 and "protect=True" in unprotected[0]
    forced = check("protected-data-buckets", BUCKET,
                   {"forceDestroy": True, "labels": {"purpose": "data"}}, name="team-a",
                   protect=True)
    assert "forceDestroy must be false" in forced[0]
    assert check("protected-data-buckets", BUCKET, {}, name="logs") == [], "not a data bucket"
    assert check("protected-data-buckets", BUCKET, {"forceDestroy": True}, name="data",
                 stack="dev", environment="dev") == []
    assert check("protected-data-buckets", BUCKET, {}, name="data", stack="dev", environment="dev",
                 config={"exemptStacks": []})


def test_apis_kept_on_destroy(check):
    service = PROJECTS_SERVICE
    assert check("apis-kept-on-destroy", service, {"service": "tpu.googleapis.com",
                                                   "disableOnDestroy": False}) == []
    kept = check("apis-kept-on-destroy", service, {"service": "tpu.googleapis.com",
                                                   "disableOnDestroy": True})
    assert "tpu.googleapis.com: set disableOnDestroy=false" in kept[0]
    assert check("apis-kept-on-destroy", service, {"service": "x"}), "missing = SDK default true"


def test_accelerator_allowlist(check, good_node):
    assert check("tpu-accelerator-allowlist", V2VM, good_node) == []
    unknown = check("tpu-accelerator-allowlist", V2VM, {**good_node, "acceleratorType": "v9-8"})
    assert "not an accelerator type" in unknown[0]
    config = {"allowedAcceleratorTypes": ["v2-8"]}
    refused = check("tpu-accelerator-allowlist", V2VM, good_node, config=config)
    assert "v5litepod-8 is not allowed" in refused[0]
    assert check("tpu-accelerator-allowlist", V2VM, {}, config=config) == [], \
        "no type: the provider's v2-8"
    by_config = {"acceleratorConfig": {"type": "V4", "topology": "2x2x1"}}
    assert check("tpu-accelerator-allowlist", V2VM, by_config,
                 config={"allowedAcceleratorTypes": ["v4-8"]}) == []
    queued_v4 = {**QUEUED_NODE, "accelerator_type": None, "accelerator_config_type": "V4",
                 "accelerator_topology": "2x2x2"}
    assert "v4-16 is not allowed" in check("tpu-accelerator-allowlist", QUEUED, queued_v4,
                                           config=config)[0]


def test_spot_stacks(check, good_node):
    spot = {**good_node, "schedulingConfig": {"spot": True}}
    preemptible = {**good_node, "schedulingConfig": {"preemptible": True}}
    assert check("tpu-spot-stacks", V2VM, spot, stack="dev", environment="dev") == []
    assert "spot/preemptible capacity in stack 'prod'" in check("tpu-spot-stacks", V2VM, spot)[0]
    assert check("tpu-spot-stacks", V2VM, preemptible)
    assert check("tpu-spot-stacks", V2VM, {"acceleratorType": "v2-8"}) == []
    assert check("tpu-spot-stacks", V2VM, spot, config={"spotStacks": ["prod"]}) == []
    assert check("tpu-spot-stacks", V2VM, spot, stack="team-nlp",
                 config={"spotStacks": ["team-*"]}) == [], "shell patterns name stacks"
    assert check("tpu-spot-stacks", QUEUED, QUEUED_NODE)
    assert check("tpu-spot-stacks", QUEUED, {**QUEUED_NODE, "spot": False}) == []


def test_dev_is_the_environment_not_the_stack_name(check, good_node):
    """One rule: tpu-stack:environment (model/settings/, environment_of)."""
    spot = {**good_node, "schedulingConfig": {"spot": True}}
    data = {"forceDestroy": True, "labels": {"purpose": "data"}}
    assert check("tpu-spot-stacks", V2VM, spot, stack="t12", environment="dev") == []
    assert check("protected-data-buckets", BUCKET, data, name="data", stack="t12",
                 environment="dev") == []
    named_dev = check("tpu-spot-stacks", V2VM, spot, stack="dev", environment="prod")
    assert named_dev and "in stack 'dev' (environment prod)" in named_dev[0]
    assert len(check("protected-data-buckets", BUCKET, data, name="data", stack="dev")) == 2
    assert check("tpu-spot-stacks", V2VM, spot, stack="lab", environment="prod",
                 config={"spotStacks": ["dev", "lab"]}) == [], "a stack name still names it"
