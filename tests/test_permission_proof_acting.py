"""Issue 44: the proof checks what IAM itself refuses and every identity that acts, not
only the deployer's table rows (policy/acting.py). Each test reintroduces one of the
issue's findings in the shipped platform plan and reads the refusal: resource,
identity, permission, where, fix."""

from __future__ import annotations

import copy

import pytest

from components import budget_stop
from components.stack_config import file_config, settings_for
from ops.plan.mock_engine import ProgramRun, Registration, run_program
from ops.plan.proof import plan_proof
from policy.acting import known_permissions, prove_acting
from policy.iam import IamModel
from policy.permissions import Applier

DEPLOYER = "serviceAccount:platform-deployer@acme-ml-shared.iam.gserviceaccount.com"
RUNTIME = "platform-nlp-budget-stop@acme-ml-shared.iam.gserviceaccount.com"
RUNTIME_NAME = f"projects/acme-ml-shared/serviceAccounts/{RUNTIME}"
FUNCTION = "gcp:cloudfunctionsv2/function:Function nlp-budget-stop"


@pytest.fixture(scope="module")
def platform_run() -> ProgramRun:
    return run_program(file_config("platform"), "platform")


def changed(run: ProgramRun, name: str) -> tuple[ProgramRun, Registration]:
    """`run` with a deep copy of its registration `name`, to change."""
    [original] = [r for r in run.registrations if r.name == name]
    copied = copy.deepcopy(original)
    return ProgramRun([copied if r is original else r for r in run.registrations],
                      run.outputs), copied


def findings(run: ProgramRun):
    return plan_proof(settings_for("platform"), run).findings


def test_item_1_a_custom_role_permission_iam_does_not_know_is_refused(platform_run) -> None:
    run, role = changed(platform_run, "nlp-budget-stop-role")
    role.inputs["permissions"] = [*role.inputs["permissions"], "tpu.queuedresources.list",
                                  "not.a.permission"]
    found = {f.permission: f for f in findings(run)}
    assert set(found) == {"tpu.queuedresources.list", "not.a.permission"}
    queued = found["tpu.queuedresources.list"]
    assert queued.resource == "gcp:projects/iAMCustomRole:IAMCustomRole nlp-budget-stop-role"
    assert queued.identity == DEPLOYER
    assert queued.on == "projects/acme-ml-shared-nlp/roles/platform_budget_stop"
    assert queued.fix.startswith("list tpu.nodes.list instead (iann0036/iam-dataset "
                                 "gcp/map.json")
    assert found["not.a.permission"].fix.startswith("remove not.a.permission")


def test_item_1_the_budget_stop_role_lists_permissions_iam_knows() -> None:
    known, _ = known_permissions()
    assert set(budget_stop.PERMISSIONS) <= known
    assert "tpu.queuedresources.list" not in known and "tpu.nodes.list" in known


def test_item_2_a_grant_to_the_deployer_itself_is_checked(platform_run) -> None:
    """The old plan's self-grant: actAs on the budget stop's account, in the host project,
    where the deployer holds iam.serviceAccountCreator only."""
    run, grant = changed(platform_run, "nlp-budget-stop-tpu")
    grant.type = "gcp:serviceaccount/iAMMember:IAMMember"
    grant.name = "nlp-budget-stop-deployer-serviceAccountUser"
    grant.inputs = {"serviceAccountId": RUNTIME_NAME, "role": "roles/iam.serviceAccountUser",
                    "member": DEPLOYER}
    refused = [f for f in findings(run) if f.resource.endswith("deployer-serviceAccountUser")]
    assert {(f.identity, f.permission, f.on) for f in refused} == {
        (DEPLOYER, permission, RUNTIME_NAME)
        for permission in ("iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.setIamPolicy")}
    assert refused[0].fix == f"grant roles/iam.serviceAccountAdmin on {RUNTIME_NAME}"


def test_item_4_the_tpu_agent_needs_network_user_and_xpn_agent(platform_run) -> None:
    kept = [r for r in platform_run.registrations if "tpu-agent" not in r.name]
    found = findings(ProgramRun(kept, platform_run.outputs))
    agent = "the TPU service agent of projects/acme-ml-shared-nlp"
    mine = {(f.resource.rsplit(" ", 1)[-1], f.permission, f.on) for f in found
            if f.identity == agent}
    subnet = "projects/acme-ml-shared/regions/us-central1/subnetworks/platform-tpu-nlp-us-central1"
    assert ("node-nlp-sweep-vm", "compute.subnetworks.use", subnet) in mine
    assert ("node-nlp-sweep-vm", "compute.addresses.createInternal", "projects/acme-ml-shared") \
        in mine
    [xpn] = [f for f in found if f.identity == agent and f.resource.endswith("sweep-vm")
             and f.on == "projects/acme-ml-shared"]
    assert xpn.fix == ("grant roles/tpu.xpnAgent on projects/acme-ml-shared to serviceAccount:"
                       "service-PROJECT_NUMBER@gcp-sa-tpu.iam.gserviceaccount.com")
    assert findings(platform_run) == []


def test_item_5_a_budget_s_topic_and_billing_project_are_checked() -> None:
    budget = {"type": "gcp:billing/budget:Budget", "name": "nlp-budget",
              "inputs": {"billingAccount": "B", "allUpdatesRule": {
                  "pubsubTopic": "projects/host/topics/t"}}}
    provider = {"type": "pulumi:providers:gcp", "name": "budgets",
                "inputs": {"billingProject": "host", "userProjectOverride": "true"}}
    found = prove_acting([budget, provider], IamModel(), Applier(DEPLOYER), {})
    assert {(f.resource, f.permission, f.on) for f in found} == {
        ("gcp:billing/budget:Budget nlp-budget", "pubsub.topics.setIamPolicy",
         "projects/host/topics/t"),
        ("gcp:billing/budget:Budget nlp-budget", "serviceusage.services.use", "projects/host")}
    assert {f.identity for f in found} == {DEPLOYER}
    assert all(f.fix.startswith("grant roles/") for f in found)


def test_item_6_a_function_without_a_build_account_is_refused(platform_run) -> None:
    run, function = changed(platform_run, "nlp-budget-stop")
    del function.inputs["buildConfig"]["serviceAccount"]
    [refused] = findings(run)
    assert refused.resource == FUNCTION
    assert refused.identity == "the Compute Engine default account"
    assert refused.permission == "cloudbuild.builds.create"
    assert "set buildConfig.serviceAccount" in refused.fix


def test_item_6_the_trigger_account_must_invoke_the_function(platform_run) -> None:
    kept = [r for r in platform_run.registrations if r.name != "nlp-budget-stop-invoker"]
    [refused] = [f for f in findings(ProgramRun(kept, platform_run.outputs))
                 if f.permission == "run.routes.invoke"]
    assert refused.identity == f"serviceAccount:{RUNTIME}"
    assert refused.on.endswith("/services/platform-nlp-budget-stop")
    assert refused.fix.startswith("grant roles/run.invoker on ")
