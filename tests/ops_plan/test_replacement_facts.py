"""ops/plan/facts: every declared type has replacement facts, each citing its source."""

from __future__ import annotations

import json
import re

import pytest

from components import queued_tpu
from components.stack_config import file_config
from model.pulumi_types import (
    CLOUDFUNCTIONSV2_FUNCTION,
    CLOUDQUOTA_S_QUOTA_PREFERENCE,
    CLOUDSCHEDULER_JOB,
    COMPUTE_FIREWALL,
    COMPUTE_SUBNETWORK,
    MONITORING_DASHBOARD,
    MONITORING_MONITORED_PROJECT,
    PROJECTS_IAM_MEMBER,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from model.pulumi_types import DYNAMIC_FALLBACK_TPU as FALLBACK_TPU
from model.pulumi_types import DYNAMIC_QUEUED_TPU as QUEUED_TPU
from ops.plan.facts import facts, type_facts
from ops.plan.facts.generate import (
    conditional_force_new,
    fallback_tpu_entry,
    mmv1_immutable,
    pulumi_path,
    resource_fields,
)
from ops.plan.offline import offline_plan
from ops.plan.steps import (
    LIST_NORMALISERS,
    NORMALISERS,
    delete_first,
    no_diff,
    replaces,
    shrinks,
    value_at,
)
from tests.repo_stacks import repo_stacks

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _queued(stack: str) -> dict[str, str]:
    config = file_config(stack)
    nodes = json.loads(config["tpu-stack:nodes"])
    nodes[0].update(provisioning="queued", queue={"spot": True})
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return config


def _with_fallback(stack: str) -> dict[str, str]:
    config = file_config(stack)
    nodes = json.loads(config["tpu-stack:nodes"])
    nodes[0].update(fallback=[{"zone": "us-west4-a"}])
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return config


@pytest.fixture(scope="module")
def declared_types() -> set[str]:
    plans = [offline_plan(stack) for stack in repo_stacks()]
    plans.append(offline_plan("dev", _queued("dev")))
    plans.append(offline_plan("dev", _with_fallback("dev")))
    return {r.type for p in plans for r in p.run.registrations if r.custom}


def test_every_type_the_program_declares_has_an_entry(declared_types):
    assert {QUEUED_TPU, FALLBACK_TPU} <= declared_types
    missing = sorted(t for t in declared_types if type_facts(t) is None)
    assert missing == [], f"no replacement facts for {missing}: add them to " \
        "ops/plan/facts/generate.py TYPES and regenerate"


def test_every_entry_and_rule_cites_repo_path_and_commit():
    for token, entry in facts()["types"].items():
        assert entry["source"], token
        for source in entry["source"]:
            assert source["repo"] and source["path"], token
            assert source["repo"] == "tpu-stack" or COMMIT.match(source["commit"]), token
    for rule, sources in facts()["rules"].items():
        assert all(COMMIT.match(s["commit"]) and s["line"] > 0 for s in sources), rule


# Normalisations the preview reads but does not model (it compares those values as
# written, so it may show a change the engine does not): none of them is on an input
# the program sets today (checked below).
UNMODELLED = {"diffSuppressEnableLogging",
              "IpDiffSuppress", "jwksJsonDiffSuppress",
              "EmptyOrDefaultStringSuppress", "inline", "hierachicalNamespaceDiffSuppress",
              "CompareCryptoKeyVersions",
              "crossSeriesReducerDiffSuppress",
              "comparePubsubSubscriptionExpirationPolicy", "IgnoreMissingKeyInMap",
              "DurationDiffSuppress"}
ENGINE_RULES = {"protectRefusesReplace", "protectedDependentBails", "protectRefusesDelete",
                "retainOnDeleteKeeps", "deletesBesideARefusalRun",
                "deleteFirstDependentsGoFirst", "sameStepWithoutDiff", "displayPrefixes",
                "displayOldToNew", "displaySummary", "normalisedBeforeDiff"}


def test_every_normalisation_cites_its_line_and_is_modelled_or_listed():
    seen = set()
    for token, entry in facts()["types"].items():
        for path, rule in entry.get("normalise", {}).items():
            assert rule["kind"] in ("StateFunc", "DiffSuppressFunc"), (token, path)
            assert rule["repo"] == "hashicorp/terraform-provider-google-beta", (token, path)
            assert COMMIT.match(rule["commit"]) and rule["line"] > 0 and rule["path"], token
            seen.add(rule["function"])
    assert seen - UNMODELLED == {*NORMALISERS, *LIST_NORMALISERS} & seen
    assert "inline:upper" in seen  # the bucket's location (resource_storage_bucket.go)
    assert set(facts()["rules"]) >= ENGINE_RULES


def test_no_unmodelled_normalisation_is_on_an_input_the_program_sets():
    for stack in repo_stacks():
        for r in offline_plan(stack).run.registrations:
            for path, rule in (type_facts(r.type) or {}).get("normalise", {}).items():
                if rule["function"] in UNMODELLED:
                    for key in (path, path + "s"):  # the bridge's plural list names
                        assert value_at(r.inputs, key.replace("[]", "")) is None, (r.type, key)


@pytest.mark.parametrize(("token", "path", "old", "new", "same"), [
    (STORAGE_BUCKET, "location", "US", "us", True),
    (STORAGE_BUCKET, "location", "US", "EU", False),
    (PROJECTS_IAM_MEMBER, "member", "group:ML@acme.example",
     "group:ml@acme.example", True),
    (PROJECTS_IAM_MEMBER, "member", "principal://X", "principal://x", False),
    (PROJECTS_IAM_MEMBER, "project", "projects/p", "p", True),
    (COMPUTE_SUBNETWORK, "network",
     "https://www.googleapis.com/compute/v1/projects/p/global/networks/vpc", "vpc", True),
    (COMPUTE_SUBNETWORK, "network",
     "https://www.googleapis.com/compute/v1/projects/p/global/networks/vpc",
     "projects/p/global/networks/vpc", True),
    (COMPUTE_SUBNETWORK, "network", "projects/p/global/networks/a", "b", False),
    (CLOUDQUOTA_S_QUOTA_PREFERENCE, "quotaConfig.preferredValue",
     None, "0", True),
    (STORAGE_BUCKET_IAM_MEMBER, "bucket", "b/x", "x", True),
    (CLOUDSCHEDULER_JOB, "httpTarget.uri", "https://f.run.app/", "https://f.run.app", True),
    (CLOUDSCHEDULER_JOB, "httpTarget.uri", "https://f.run.app", "https://g.run.app", False),
    (CLOUDSCHEDULER_JOB, "httpTarget.oidcToken",
     [{"serviceAccountEmail": "a@p", "audience": "https://f"}], {"serviceAccountEmail": "a@p"},
     True),  # the API's default audience, which the configuration leaves out
    (CLOUDSCHEDULER_JOB, "httpTarget.oidcToken", {"serviceAccountEmail": "a@p", "audience": "x"},
     {"serviceAccountEmail": "b@p", "audience": "x"}, False),
    (COMPUTE_FIREWALL, "sourceRanges", ["b", "a"], ["a", "b"], True),
    (COMPUTE_FIREWALL, "sourceRanges", ["0.0.0.0/0"], None, True),
    (COMPUTE_FIREWALL, "sourceRanges", ["10.0.0.0/8"], None, False),
    (TPU_V2_VM, "serviceAccount.scopes", ["a", "https://www.googleapis.com/auth/pubsub"],
     ["a"], True),
    (TPU_V2_VM, "serviceAccount.scopes", ["a"], ["b"], False),
    (CLOUDFUNCTIONSV2_FUNCTION, "serviceConfig.environmentVariables",
     {"A": "1", "LOG_EXECUTION_ID": "true"}, {"A": "1"}, True),
    (CLOUDFUNCTIONSV2_FUNCTION, "serviceConfig.environmentVariables",
     {"A": "1"}, {"A": "2"}, False),
    (MONITORING_MONITORED_PROJECT, "name", "locations/global/metricsScopes/s/projects/123",
     "acme-ml", True),  # the API's project number against the id the program sets
    (MONITORING_MONITORED_PROJECT, "name", "projects/acme-a", "acme-b", False),
    (MONITORING_MONITORED_PROJECT, "name", "", "acme-a", False),
    (MONITORING_DASHBOARD, "dashboardJson", '{"a": 1, "etag": "x", "b": [{"c": 2, "d": 3}]}',
     '{"a": 1.0, "b": [{"c": 2}]}', True),  # keys the config lacks: the API's
    (MONITORING_DASHBOARD, "dashboardJson", '{"a": 1}', '{"a": 2}', False),
    (MONITORING_DASHBOARD, "dashboardJson", '{"a": 1}', '{"a": 1, "b": 2}', False),
    (MONITORING_DASHBOARD, "dashboardJson", '{"a": true}', '{"a": 1}', False),
])
def test_normalised_values_compare_as_the_provider_compares_them(token, path, old, new, same):
    assert no_diff(type_facts(token), path, old, new) is same


def test_the_provider_facts_read_as_the_provider_behaves():
    subnet = type_facts(COMPUTE_SUBNETWORK)
    assert subnet["forceNewIf"] == {"ipCidrRange": "IsShrinkageIpCidr"}
    assert {"name", "network", "region"} <= set(subnet["forceNew"])
    vm = type_facts(TPU_V2_VM)
    assert {"networkConfig.subnetwork", "runtimeVersion", "acceleratorType",
            "schedulingConfig.spot"} <= set(vm["forceNew"])
    assert not {"labels", "metadata", "description", "tags"} & set(vm["forceNew"])
    # magic-modules documents the same fields immutable.
    assert "networkConfig.subnetwork" in vm["mmv1"]["immutable"]
    package = type_facts(STORAGE_BUCKET_OBJECT)
    assert {"name", "source", "metadata"} <= set(package["forceNew"])
    assert package["autoName"] == "name"


def test_the_queued_entry_follows_its_provider():
    entry = type_facts(QUEUED_TPU)
    assert entry["replaceUnless"] == sorted(queued_tpu.IN_PLACE + queued_tpu.PROVIDER_ONLY), \
        "components/queued_tpu.py changed: regenerate ops/plan/facts/replacement.json"
    assert entry["deleteBeforeReplace"] is True
    assert entry["heldWhileWaiting"] == sorted(queued_tpu.IN_PLACE)
    assert "requeueWhileWaiting" not in entry


@pytest.mark.parametrize(("old", "new", "shrunk"), [
    ("10.128.0.0/20", "10.128.0.0/21", True),
    ("10.128.0.0/20", "10.128.0.0/19", False),
    ("10.128.0.0/20", "10.130.0.0/20", True),
    ("10.128.0.0/20", "(unknown)", False),
])
def test_shrinkage_is_the_providers_condition(old, new, shrunk):
    assert shrinks(old, new) is shrunk


def test_who_deletes_first():
    subnet = {"type": COMPUTE_SUBNETWORK, "inputs": {"name": "x"},
              "deleteBeforeReplace": None}
    assert delete_first(subnet) == (True, "its name is set explicitly, so two cannot exist at "
                                    "once")
    assert delete_first({**subnet, "inputs": {}}) == (False, "")  # auto-named
    assert delete_first({**subnet, "deleteBeforeReplace": False}) == (
        False, "the delete_before_replace option")
    member = {"type": PROJECTS_IAM_MEMBER, "inputs": {}}
    assert delete_first(member) == (True, "the provider deletes it first")
    assert replaces(subnet, "ipCidrRange", "10.0.0.0/20", "10.0.0.0/21") == (True, "shrinks")
    assert replaces(subnet, "ipCidrRange", "10.0.0.0/21", "10.0.0.0/20") == (False, "update")


GO_SCHEMA = '''
func ResourceThing() *schema.Resource {
	return &schema.Resource{
		CustomizeDiff: customdiff.All(
			customdiff.ForceNewIfChange("size_gb", IsShrinkage),
		),
		Schema: map[string]*schema.Schema{
			"name": {
				Type:     schema.TypeString,
				Required: true,
				ForceNew: true,
				StateFunc: func(s interface{}) string {
					return strings.ToUpper(s.(string))
				},
				Description: `A { brace in a raw string.`,
			},
			"config": {
				Type:     schema.TypeList,
				Optional: true,
				MaxItems: 1,
				Elem: &schema.Resource{
					Schema: map[string]*schema.Schema{
						"zone": {Type: schema.TypeString, Optional: true, ForceNew: true},
						"tier": {Type: schema.TypeString, Optional: true,
							DiffSuppressFunc: tpgresource.CaseDiffSuppress},
					},
				},
			},
			"rules": {
				Type: schema.TypeList,
				Elem: &schema.Resource{
					Schema: map[string]*schema.Schema{
						"kind": {Type: schema.TypeString, ForceNew: true}, // "}"
					},
				},
			},
		},
	}
}
'''


def test_the_generator_reads_a_go_schema():
    fields = resource_fields(GO_SCHEMA, None)
    assert sorted(pulumi_path(f) for f in fields if f.force_new) == [
        "config.zone", "name", "rules[].kind"]
    normalised = {pulumi_path(f): f.normalise[:2] for f in fields if f.normalise}
    assert normalised == {"name": ("StateFunc", "inline:upper"),
                          "config.tier": ("DiffSuppressFunc", "CaseDiffSuppress")}
    assert conditional_force_new(GO_SCHEMA) == {"size_gb": "IsShrinkage"}


def test_the_generator_reads_mmv1_immutability():
    product = """
name: Thing
properties:
  - name: zone
    immutable: true
  - name: labels
  - name: networkConfig
    type: NestedObject
    properties:
      - name: subnetwork
        immutable: true
"""
    assert mmv1_immutable(product) == ["networkConfig.subnetwork", "zone"]


def test_the_fallback_entry_follows_its_provider():
    assert type_facts(FALLBACK_TPU) == fallback_tpu_entry(), \
        "components/fallback_tpu.py changed: regenerate ops/plan/facts/replacement.json"
    assert "candidates" in type_facts(FALLBACK_TPU)["replaceUnless"]
    assert "service_account_email" not in type_facts(FALLBACK_TPU)["replaceUnless"]
